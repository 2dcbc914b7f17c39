"""
The gateway's life once built (``tap.build`` makes every part and gives them here): its
listeners started, systemd told, the snapshots' store opened, the accounts reloaded on
SIGHUP, what it runs said in the log, and on stop every computer closed gracefully.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from autobahn.websocket import USES_NVX
from twisted.application import service
from twisted.internet import endpoints
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool

from trapsandbox import __version__, config, limits
from trapsandbox.admission.auth import Admission
from trapsandbox.compat import fixes
from trapsandbox.computers.protocol import GatewayFactory
from trapsandbox.errors import ConfigError
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.managed import ManagedOpencode
from trapsandbox.opencode.probe import redact
from trapsandbox.ops.systemd import Notifier
from trapsandbox.snapshots.service import Snapshots
from trapsandbox.snapshots.store import SnapshotStore
from trapsandbox.web.opsocket import OperatorSocketFactory

log = Logger()


class Listener(service.Service):
    """Listen on one endpoint; a failure stops the daemon with one line."""

    def __init__(self, reactor: Any, description: str, factory: Any) -> None:
        self._reactor = reactor
        self.description = description
        self._factory = factory
        self.port: IListeningPort | None = None
        try:
            self._endpoint = endpoints.serverFromString(reactor, description)
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"--port {description!r} is not a valid endpoint: {error}") from None

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        failures = []
        d = self._endpoint.listen(self._factory)
        d.addCallbacks(self._listening, failures.append)
        if failures:
            error = failures[0].value
            if isinstance(error, CannotListenError) and error.socketError is not None:
                reason = error.socketError.strerror or str(error.socketError)
            else:
                reason = str(error)
            raise SystemExit(f"trapsandbox: cannot listen on {self.description}: {reason}")

    def _listening(self, port: IListeningPort) -> None:
        self.port = port
        log.info("listening on {address}", address=_describe(port.getHost()))

    def stopService(self) -> Deferred | None:
        super().stopService()
        if self.port is not None:
            return self.port.stopListening()
        return None


def _describe(address: Any) -> str:
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if host is not None and port is not None:
        return f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    return str(getattr(address, "name", address))


class GatewayService(service.MultiService):
    """
    The gateway's life: its listeners started, systemd told, the snapshots'
    store opened, the accounts reloaded on SIGHUP, and on stop every computer
    closed gracefully.  Its parts are built by ``tap.build`` and given to it;
    ``settings``, ``admission`` and ``mode`` (the fast paths in use, or None for
    the plain mode) only for what it says when it starts.
    """

    def __init__(
        self,
        reactor: Any,
        *,
        settings: config.Settings,
        admission: Admission,
        mode: str | None,
        notifier: Notifier,
        listeners: list[Listener],
        computers: GatewayFactory,
        operator_sockets: OperatorSocketFactory,
        asks: Asks,
        http_pool: HTTPConnectionPool,
        snapshots: Snapshots,
        open_store: Callable[[], Deferred[SnapshotStore]],
        reload_accounts: Callable[[], bool],
        cluster: Any = None,
        managed: ManagedOpencode | None = None,
    ) -> None:
        super().__init__()
        self._reactor = reactor
        self._settings = settings
        self._admission = admission
        self._mode = mode
        self._notifier = notifier
        self._listeners = listeners
        self._computers = computers
        self._operator_sockets = operator_sockets
        self._asks = asks
        self._pool = http_pool
        self._snapshots = snapshots
        self._open_store = open_store
        self._reload_accounts = reload_accounts
        self._cluster = cluster
        self._managed = managed
        # Set by makeService: the real daemon reloads the accounts on SIGHUP.
        self.reload_on_sighup = False
        self._previous_sighup: Any = None
        for listener in listeners:
            listener.setServiceParent(self)
        # The opencode servers it runs, if it does: started after the ports, stopped once
        # the running asks' aborts reached them (``stopService``).

    def _sighup(self, signum: int, frame: Any) -> None:
        # A signal handler runs between two bytecodes of whatever the reactor
        # was doing: do the work on the reactor's own turn.
        self._reactor.callFromThread(self._reload_accounts)

    def startService(self) -> None:
        super().startService()
        # The snapshots' store is opened at start, not when the service is built: a store's
        # thread or connection must not keep alive a process that never started (a port in
        # use, a build for a check).
        self._snapshots.opening(self._open_store())
        if self.reload_on_sighup:
            # Twisted's own handlers are SIGINT, SIGTERM and SIGCHLD; SIGHUP is ours.
            self._previous_sighup = signal.signal(signal.SIGHUP, self._sighup)
        if self._cluster is not None:
            self._cluster.start()
        if self._managed is not None:
            self._managed.startService()
        # privilegedStartService bound every port: connections are accepted now.
        self._notifier.ready(
            "listening on " + ", ".join(_describe(each.port.getHost()) for each in self._listeners)
        )
        self._log_started()

    def _log_started(self) -> None:
        settings, admission = self._settings, self._admission
        log.info(
            "trapsandbox {version} started: auth {auth}, opencode at {opencode}, NVX {nvx}",
            version=__version__,
            auth="on" if admission.enabled else "off",
            opencode="its own (OPENCODE_URL unset): "
            + ", ".join(m.url for m in self._managed.servers)
            if self._managed is not None
            else ", ".join(map(redact, settings.opencode_urls)) or "(not set: no agent)",
            nvx="in use" if USES_NVX else "not available",
        )
        log.info(
            "mode: {mode}",
            mode="plain (Twisted, Klein and Autobahn as they ship)"
            if self._mode is None
            else f"fast paths ({self._mode})",
        )
        log.info(
            "operator endpoints: {operators}",
            operators="bearer token required"
            if settings.admin_token
            else "loopback clients only (no SANDBOX_ADMIN_TOKEN)"
            if admission.accounts is None
            else "account tokens, and loopback clients as the admin (no SANDBOX_ADMIN_TOKEN)",
        )
        if admission.accounts is not None:
            log.info(
                "accounts: {count} from {path} (SIGHUP reloads it)",
                count=len(admission.accounts),
                path=settings.accounts_file,
            )
        if not admission.enabled:
            log.warn(
                "auth is off: any computer can connect. Set SANDBOX_PASSWORD or "
                "SANDBOX_PASSWORD_FILE to require a secret."
            )
        password = settings.password
        if password is not None and len(password) < limits.MIN_PASSWORD_LENGTH:
            # A right guess is let in even from a throttled address: only the
            # password's strength stops guessing.
            log.warn(
                "SANDBOX_PASSWORD is shorter than {least} characters: a right guess is let "
                "in even from an address refused for wrong ones, so its strength is what "
                "stops guessing. Use a long random one, e.g. head -c 24 /dev/urandom | base64",
                least=limits.MIN_PASSWORD_LENGTH,
            )
        if admission.trusted_proxies:
            log.info(
                "trusted reverse proxies: {proxies} (their X-Forwarded-For/Forwarded name "
                "the client)",
                proxies=", ".join(map(str, settings.trusted_proxies)),
            )

    def stopService(self) -> Deferred:
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
            self._previous_sighup = None
        self._notifier.stopping()
        log.info(
            "shutting down: closing {count} connections", count=len(self._computers.connections)
        )
        stopped = super().stopService()  # stop listening first
        # Before the computers close (their players are told), and opencode has the aborts
        # before the pool's connections close.
        aborted = self._asks.stop()
        aborted.addBoth(lambda _: self._pool.closeCachedConnections())
        if self._managed is not None:
            # Its own opencode stopped once the aborts reached it, not before.
            managed = self._managed
            aborted.addBoth(lambda _: managed.stopService())
        closed = self._computers.shutdown()
        # After the computers: requests failed by their close are answered first.
        self._operator_sockets.shutdown()
        if self._cluster is not None:
            # Once every computer is closed (and released), leave the cluster.
            cluster = self._cluster
            closed.addBoth(lambda _: cluster.stop())
        d = DeferredList(
            [stopped, closed, aborted, self._snapshots.close()],
            consumeErrors=True,
        )
        d.addCallback(self._stopped)
        return d

    def _stopped(self, _: object) -> None:
        self._notifier.close()
        log.info("all computers closed; exiting")
        fixes.exit_zero_after_stop_signal(self._reactor)
