"""
``twistd trapsandbox``: its options, the composition root (``build``: every
part of the gateway made from the settings and handed to what uses it) and
the service that starts and stops them.
"""

from __future__ import annotations

import gc
import os
import signal
from typing import TYPE_CHECKING, Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.websocket import USES_NVX
from treq.client import HTTPClient
from twisted.application import service
from twisted.internet import endpoints
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.client import Agent, HTTPConnectionPool

from trapsandbox import __version__, config, limits, state
from trapsandbox.admission import accounts
from trapsandbox.admission.auth import Admission
from trapsandbox.admission.strangers import Strangers
from trapsandbox.compat import fixes
from trapsandbox.computers import wire
from trapsandbox.computers.protocol import GatewayFactory
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.session import describe_session
from trapsandbox.errors import ConfigError
from trapsandbox.handlers import ComputerRequests
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.managed import ManagedOpencode
from trapsandbox.opencode.probe import OpencodeProbe, redact
from trapsandbox.opencode.queue import AskQueue
from trapsandbox.opencode.servers import Server, ServerProbes
from trapsandbox.opencode.tokens import AskTokens
from trapsandbox.ops.metrics import Metrics
from trapsandbox.ops.systemd import Notifier
from trapsandbox.snapshots.askhook import AskSnapshots
from trapsandbox.snapshots.service import Snapshots
from trapsandbox.web.app import GatewayApp
from trapsandbox.web.listener import CountedSite
from trapsandbox.web.operator import OperatorRequests
from trapsandbox.web.opsocket import OperatorSocketFactory
from trapsandbox.web.site import GatewaySite

if TYPE_CHECKING:
    from trapsandbox.fast.paths import FastPaths

log = Logger()


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run the trapsandbox gateway: a WebSocket endpoint /gateway for CraftOS "
        "computers and an HTTP app (/health; for operators /computers and /metrics) "
        "on one port. Settings not given as "
        "options come from the environment (SANDBOX_*, OPENCODE_*)."
    )
    optParameters = [
        ["password-file", None, None, "Read the computers' shared secret from this file."],
        ["password", None, None, "The computers' shared secret (prefer --password-file)."],
        ["admin-token-file", None, None, "Read the operators' bearer token from this file."],
        [
            "admin-token",
            None,
            None,
            "The operators' bearer token (prefer --admin-token-file; unset: loopback only).",
        ],
        [
            "accounts-file",
            None,
            None,
            "The accounts file (TOML; several players on one gateway); SIGHUP reloads it.",
        ],
        ["request-timeout-ms", None, None, "Default timeout of requests to a computer."],
        [
            "max-connections",
            None,
            None,
            f"Most WebSocket connections at once ({limits.MAX_CONNECTIONS}).",
        ],
        [
            "max-unauthenticated-per-address",
            None,
            None,
            "Most connections from one address still awaiting hello "
            f"({limits.MAX_UNAUTHENTICATED_PER_ADDRESS}).",
        ],
        [
            "max-operator-sockets-per-account",
            None,
            None,
            "Most /operator WebSockets one account's token holds open at once "
            f"({limits.MAX_OPERATOR_SOCKETS_PER_ACCOUNT}).",
        ],
        [
            "opencode-url",
            None,
            None,
            "An opencode server run apart, or several separated by commas (empty: no agent; "
            "unset: the gateway runs opencode itself).",
        ],
        [
            "opencode-bin",
            None,
            None,
            "The opencode program the gateway runs (default: opencode on PATH, else the one "
            "make installs).",
        ],
        [
            "opencode-max-rss-mb",
            None,
            None,
            "A server the gateway runs is recycled past this memory, between asks "
            f"({limits.OPENCODE_MAX_RSS_MB}).",
        ],
        [
            "opencode-servers",
            None,
            None,
            f"How many opencode servers the gateway runs ({limits.DEFAULT_OPENCODE_SERVERS}).",
        ],
        ["opencode-username", None, None, "opencode's Basic-auth user."],
        ["opencode-password", None, None, "opencode's Basic-auth password."],
        [
            "redis",
            None,
            None,
            "Cluster mode: share computers with other gateways through this Redis, "
            "redis://[:PASSWORD@]HOST[:PORT][/DB] (SANDBOX_REDIS_URL).",
        ],
        [
            "redis-refresh-ms",
            None,
            None,
            "Cluster mode: how often ownership is refreshed "
            f"({limits.CLUSTER_REFRESH_INTERVAL * 1000:g}; owner keys live 3 times as long).",
        ],
        ["ask-dir", None, None, "Where sandbox ask keeps each computer's opencode directory."],
        [
            "state-dir",
            None,
            None,
            f"What the gateway keeps on disk (./{limits.DEFAULT_STATE_DIR}); made private (0700).",
        ],
        [
            "max-ask-conversations",
            None,
            None,
            "Ask conversations remembered per account, the least recently used dropped "
            f"({limits.MAX_ASK_CONVERSATIONS}).",
        ],
        [
            "ask-instance-idle-ms",
            None,
            None,
            "An opencode instance of an asking computer is given back after this long unused "
            f"({limits.ASK_INSTANCE_IDLE * 1000:g}).",
        ],
        [
            "ask-max-instances",
            None,
            None,
            "opencode instances kept live per opencode server, the least recently used given "
            f"back first ({limits.ASK_MAX_INSTANCES}).",
        ],
        [
            "ask-max-running",
            None,
            None,
            "Asks running at once per opencode server; more wait in order "
            f"({limits.ASK_MAX_RUNNING}).",
        ],
        [
            "ask-max-running-per-account",
            None,
            None,
            "Asks running at once per account; more wait in order "
            f"({limits.ASK_MAX_RUNNING_PER_ACCOUNT}).",
        ],
        [
            "trusted-proxies",
            None,
            None,
            "Reverse proxies whose X-Forwarded-For/Forwarded name the client: comma-separated "
            "addresses or CIDRs, or unix (SANDBOX_TRUSTED_PROXIES; default none).",
        ],
        [
            "snapshots-keep",
            None,
            None,
            f"Snapshots kept per computer, the oldest pruned ({limits.SNAPSHOTS_KEEP}).",
        ],
        [
            "snapshot-quota-mb",
            None,
            None,
            "MiB of snapshots (file lists and content) kept per account, the oldest pruned "
            f"({limits.SNAPSHOT_QUOTA_BYTES // 2**20}).",
        ],
        [
            "snapshot-max-mb",
            None,
            None,
            "A computer whose files take more MiB than this is not snapshotted "
            f"({limits.SNAPSHOT_MAX_BYTES // 2**20}).",
        ],
    ]
    optFlags = [
        [
            "plain",
            None,
            "Run on Twisted, Klein and Autobahn as they ship, without the fast paths "
            "(SANDBOX_FAST_PATHS=0).",
        ],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["port"] = []

    def opt_port(self, description: str) -> None:
        """
        A Twisted endpoint to listen on, e.g. tcp:4444:interface=0.0.0.0,
        unix:/run/trapsandbox/gw.sock, systemd:domain=INET6:name=gateway.
        Repeatable. Default: tcp:$SANDBOX_PORT:interface=$SANDBOX_HOST.
        """
        self["port"].append(description)

    opt_p = opt_port


class _Listener(service.Service):
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


def build(
    settings: config.Settings,
    reactor: Any,
    notifier: Notifier | None = None,
    fast: FastPaths | None = None,
) -> GatewayService:
    """
    The composition root: every part of the gateway built here, from
    ``settings``, and handed to what uses it; ``GatewayService`` only starts
    and stops them.  ``fast``: what ``fast.paths.install`` returned, or None
    for the plain mode (the libraries as they ship).  ``makeService`` calls it
    for twistd; the tests and benchmarks call it for a gateway of their own.
    """
    # Made private here, at start: a bad one stops the daemon with one line.
    state_dir = state.prepare(settings.state_dir, "SANDBOX_STATE_DIR")
    metrics = Metrics()
    registry = Registry(reactor, request_timeout=settings.request_timeout, metrics=metrics)
    admission = Admission(
        reactor,
        settings.password,
        settings.admin_token,
        accounts=settings.accounts,
        trusted_proxies=settings.trusted_proxies,
    )
    sandbox = Sandbox(registry)
    # Snapshots (SPEC §15); their store is opened when the service starts.
    snapshots = Snapshots(sandbox, clock=reactor)
    pool, asks, probe, managed = _opencode(settings, reactor, state_dir, metrics, snapshots)
    asks.watch(registry)  # a computer's asks end with its connection
    factory = GatewayFactory(
        registry,
        admission,
        ComputerRequests(probe, asks, snapshots, registry).table(),
        reactor,
        metrics=metrics,
        max_connections=settings.max_connections,
        max_unauthenticated_per_address=settings.max_unauthenticated_per_address,
    )
    cluster = None
    if settings.redis_url is not None:
        # Imported only here: one process needs neither txredisapi nor Redis.
        from trapsandbox.cluster.member import Cluster

        cluster = Cluster(
            registry,
            settings.redis_url,
            reactor,
            describe_session,
            refresh_interval=settings.cluster_refresh_interval,
        )
        registry.peers = cluster
        metrics.watch_cluster(lambda: cluster.size, lambda: int(cluster.redis_ok))
    requests = OperatorRequests(
        registry, admission, snapshots, cluster=cluster, asks=asks, sandbox=sandbox
    )
    operator_socket = OperatorSocketFactory(
        requests, reactor, metrics, max_per_account=settings.max_operator_sockets_per_account
    )
    app = web_app(
        registry,
        probe,
        WebSocketResource(factory),
        requests,
        metrics,
        cluster=cluster,
        asks=asks,
        operator_socket=WebSocketResource(operator_socket),
        sandbox=sandbox,
        managed=managed,
    )
    site = GatewaySite(app.resource(), decide=app.decide)
    strangers = Strangers(limits.MAX_UNADMITTED_HTTP_PER_ADDRESS)
    if fast is None:
        listening: Any = CountedSite(site, reactor, strangers)
    else:
        fast.protocols(factory, operator_socket)
        listening = fast.listener(site, factory, reactor, requests, operator_socket, strangers)
    return GatewayService(
        settings,
        reactor,
        notifier=Notifier(reactor) if notifier is None else notifier,
        fast=fast,
        state_dir=state_dir,
        metrics=metrics,
        registry=registry,
        admission=admission,
        sandbox=sandbox,
        snapshots=snapshots,
        asks=asks,
        probe=probe,
        http_pool=pool,
        factory=factory,
        cluster=cluster,
        operator_socket=operator_socket,
        site=site,
        strangers=strangers,
        listeners=[_Listener(reactor, port, listening) for port in settings.ports],
        managed=managed,
    )


def _opencode(
    settings: config.Settings,
    reactor: Any,
    state_dir: str,
    metrics: Metrics,
    snapshots: Snapshots,
) -> tuple[HTTPConnectionPool, Asks, Any, ManagedOpencode | None]:
    """The HTTP client to opencode, its probes (one per server), sandbox ask, and the
    opencode servers the gateway runs itself (OPENCODE_URL unset), if so."""
    ask_directory = state.prepare(
        settings.ask_directory or os.path.join(state_dir, limits.ASK_DIRECTORY_NAME),
        "SANDBOX_ASK_DIR",
    )
    pool = HTTPConnectionPool(reactor, persistent=True)
    # As many connections kept open to each opencode server as asks may run there at once, so
    # a call finds one open rather than opening a new TCP connection (its name looked up in a
    # thread, two log lines): with 2 kept, bench.ask opened ~2.5 connections per ask (102 for
    # 40 asks), with 16 about one (41).
    pool.maxPersistentPerHost = settings.ask_max_running
    http = HTTPClient(Agent(reactor, pool=pool, connectTimeout=limits.OPENCODE_CONNECT_TIMEOUT))
    tokens = AskTokens()
    managed = None
    if settings.managed:
        managed = ManagedOpencode.build(
            reactor, settings.opencode_servers, settings.opencode_bin, os.environ
        )
        metrics.watch_managed(managed.figures)
        # Each its own password, made now; the username is opencode's default.
        where = [(m.url, limits.DEFAULT_OPENCODE_USERNAME, m.password, m) for m in managed.servers]
    else:
        where = [
            (url, settings.opencode_username, settings.opencode_password, None)
            for url in settings.opencode_urls or ("",)
        ]
    servers = [
        Server.build(
            OpencodeClient(http, reactor, url, username, password),
            reactor,
            ask_directory,
            tokens,
            settings.ask_instance_idle,
            settings.ask_max_instances,
            managed=runs,
        )
        for url, username, password, runs in where
    ]
    asks = Asks(
        servers,
        reactor,
        metrics,
        tokens,
        AskQueue(reactor, settings.ask_max_running, settings.ask_max_running_per_account),
        max_conversations=settings.max_ask_conversations,
        snapshots=AskSnapshots(snapshots, reactor),
        max_rss=settings.opencode_max_rss,
    )
    probes = [
        OpencodeProbe(
            http,
            reactor,
            url,
            username,
            password,
            metrics=metrics,
            unready=None if runs is None else runs.unready,
        )
        for url, username, password, runs in where
    ]
    # Several opencode servers (OPENCODE_URL a list): each probed on its own, told as one.
    return pool, asks, probes[0] if len(probes) == 1 else ServerProbes(probes), managed


def web_app(
    registry: Registry,
    probe: Any,
    websocket: Any,
    requests: OperatorRequests,
    metrics: Metrics,
    cluster: Any = None,
    asks: Asks | None = None,
    operator_socket: Any = None,
    sandbox: Sandbox | None = None,
    managed: ManagedOpencode | None = None,
) -> GatewayApp:
    """The HTTP app and the parts only it uses: the MCP endpoint (and the §9 sandbox
    when the gateway does not share its own)."""
    sandbox = Sandbox(registry) if sandbox is None else sandbox
    return GatewayApp(
        registry,
        probe,
        websocket,
        requests,
        sandbox,
        McpEndpoint(
            registry,
            sandbox,
            metrics,
            before_change=None if asks is None else asks.before_change,
        ),
        metrics,
        cluster=cluster,
        asks=asks,
        operator_socket=operator_socket,
        managed=managed,
    )


class GatewayService(service.MultiService):
    """
    The gateway's life: its listeners started, systemd told, the snapshots'
    store opened, the accounts reloaded on SIGHUP, and on stop every computer
    closed gracefully.  Its parts are built by ``build`` and given to it.
    """

    def __init__(
        self,
        settings: config.Settings,
        reactor: Any,
        *,
        notifier: Notifier,
        fast: FastPaths | None,
        state_dir: str,
        metrics: Metrics,
        registry: Registry,
        admission: Admission,
        sandbox: Sandbox,
        snapshots: Snapshots,
        asks: Asks,
        probe: Any,
        http_pool: HTTPConnectionPool,
        factory: GatewayFactory,
        cluster: Any,
        operator_socket: OperatorSocketFactory,
        site: GatewaySite,
        strangers: Strangers,
        listeners: list[_Listener],
        managed: ManagedOpencode | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self._reactor = reactor
        self.notifier = notifier
        self.fast = fast
        self.state_dir = state_dir
        self.metrics = metrics
        self.registry = registry
        self.admission = admission
        self.sandbox = sandbox
        self.snapshots = snapshots
        self.asks = asks
        self.probe = probe
        self._pool = http_pool
        self.factory = factory
        self.cluster = cluster
        self.operator_socket = operator_socket
        self.site = site
        self.strangers = strangers
        self.listeners = listeners
        # Set by makeService: the real daemon reloads the accounts on SIGHUP.
        self.reload_on_sighup = False
        self._previous_sighup: Any = None
        metrics.watch(
            computers=lambda: len(registry),
            connections=lambda: len(factory.connections),
            pending=lambda: registry.pending,
        )
        metrics.watch_accounts(self._account_counts)
        for listener in listeners:
            listener.setServiceParent(self)
        # The opencode servers it runs, if it does: started after the ports, stopped first.
        self.managed = managed
        if managed is not None:
            managed.setServiceParent(self)

    def _open_snapshots(self) -> None:
        """
        The snapshots' store: in the cluster's Redis, else SQLite in the state
        directory.  Opened at start, not when the service is built: a store's
        thread or connection must not keep alive a process that never started
        (a port in use, a build for a check).
        """
        if self.settings.redis_url is not None:
            from trapsandbox.snapshots.redisstore import RedisStore

            store = RedisStore.connect(
                self.settings.redis_url, self._reactor, **self.settings.snapshot_store_settings()
            )
            # Calls made meanwhile wait; a Redis still away after that is said by each call.
            connected = store.wait_connected(limits.CLUSTER_CALL_TIMEOUT)
            self.snapshots.opening(connected.addBoth(lambda _: store))
        else:
            from trapsandbox.snapshots.sqlitestore import SqliteStore

            self.snapshots.opening(
                SqliteStore.open(
                    self.state_dir, self._reactor, **self.settings.snapshot_store_settings()
                )
            )

    def _account_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.admission.account_names(), 0)
        counts.update(self.registry.counts())
        return counts

    def reload_accounts(self) -> bool:
        """
        Read the accounts file again (SIGHUP).  Computers whose account is
        gone, or whose account's secret changed, are closed with 4001; every
        other connection stays.  A bad file keeps the accounts in use and
        logs one error line.  True if the new accounts are in use.
        """
        path = self.settings.accounts_file
        if path is None:
            log.info("reload: no accounts file is configured; nothing to reload")
            return False
        try:
            self.admission.reload(accounts.load(path))
        except ConfigError as error:
            log.error(
                "accounts not reloaded, keeping the {count} in use: {error}",
                count=len(self.admission.accounts or ()),
                error=str(error),
            )
            return False
        revoked = self.admission.revoked(self.registry)
        for session in revoked:
            # Unreachable at once, before its close handshake ends.
            self.registry.remove(session)
            session.link.close(wire.CLOSE_UNAUTHORIZED, "unauthorized")
        sockets = self.operator_socket.revoke(self.admission)
        log.info(
            "accounts reloaded from {path}: {count} accounts; {closed} computers closed{sockets}",
            path=path,
            count=len(self.admission.accounts or ()),
            closed=len(revoked),
            sockets=f", {sockets} operator sockets closed" if sockets else "",
        )
        return True

    def _sighup(self, signum: int, frame: Any) -> None:
        # A signal handler runs between two bytecodes of whatever the reactor
        # was doing: do the work on the reactor's own turn.
        self._reactor.callFromThread(self.reload_accounts)

    def startService(self) -> None:
        super().startService()
        self._open_snapshots()
        if self.reload_on_sighup:
            # Twisted's own handlers are SIGINT, SIGTERM and SIGCHLD; SIGHUP is ours.
            self._previous_sighup = signal.signal(signal.SIGHUP, self._sighup)
        if self.cluster is not None:
            self.cluster.start()
        # privilegedStartService bound every port: connections are accepted now.
        self.notifier.ready(
            "listening on " + ", ".join(_describe(each.port.getHost()) for each in self.listeners)
        )
        log.info(
            "trapsandbox {version} started: auth {auth}, opencode at {opencode}, NVX {nvx}",
            version=__version__,
            auth="on" if self.admission.enabled else "off",
            opencode="its own (OPENCODE_URL unset): "
            + ", ".join(m.url for m in self.managed.servers)
            if self.managed is not None
            else ", ".join(map(redact, self.settings.opencode_urls)) or "(not set: no agent)",
            nvx="in use" if USES_NVX else "not available",
        )
        log.info(
            "mode: {mode}",
            mode="plain (Twisted, Klein and Autobahn as they ship)"
            if self.fast is None
            else f"fast paths ({self.fast.describe()})",
        )
        log.info(
            "operator endpoints: {operators}",
            operators="bearer token required"
            if self.settings.admin_token
            else "loopback clients only (no SANDBOX_ADMIN_TOKEN)"
            if self.admission.accounts is None
            else "account tokens, and loopback clients as the admin (no SANDBOX_ADMIN_TOKEN)",
        )
        if self.admission.accounts is not None:
            log.info(
                "accounts: {count} from {path} (SIGHUP reloads it)",
                count=len(self.admission.accounts),
                path=self.settings.accounts_file,
            )
        if not self.admission.enabled:
            log.warn(
                "auth is off: any computer can connect. Set SANDBOX_PASSWORD or "
                "SANDBOX_PASSWORD_FILE to require a secret."
            )
        password = self.settings.password
        if password is not None and len(password) < limits.MIN_PASSWORD_LENGTH:
            # A right guess is let in even from a throttled address: only the
            # password's strength stops guessing.
            log.warn(
                "SANDBOX_PASSWORD is shorter than {least} characters: a right guess is let "
                "in even from an address refused for wrong ones, so its strength is what "
                "stops guessing. Use a long random one, e.g. head -c 24 /dev/urandom | base64",
                least=limits.MIN_PASSWORD_LENGTH,
            )
        if self.admission.trusted_proxies:
            log.info(
                "trusted reverse proxies: {proxies} (their X-Forwarded-For/Forwarded name "
                "the client)",
                proxies=", ".join(map(str, self.settings.trusted_proxies)),
            )

    def stopService(self) -> Deferred:
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
            self._previous_sighup = None
        self.notifier.stopping()
        log.info("shutting down: closing {count} connections", count=len(self.factory.connections))
        stopped = super().stopService()  # stop listening first
        # Before the computers close (their players are told), and opencode has the aborts
        # before the pool's connections close.
        aborted = self.asks.stop()
        aborted.addBoth(lambda _: self._pool.closeCachedConnections())
        closed = self.factory.shutdown()
        # After the computers: requests failed by their close are answered first.
        self.operator_socket.shutdown()
        if self.cluster is not None:
            # Once every computer is closed (and released), leave the cluster.
            cluster = self.cluster
            closed.addBoth(lambda _: cluster.stop())
        d = DeferredList(
            [stopped, closed, aborted, self.snapshots.close()],
            consumeErrors=True,
        )
        d.addCallback(self._stopped)
        return d

    def _stopped(self, _: object) -> None:
        self.notifier.close()
        log.info("all computers closed; exiting")
        fixes.exit_zero_after_stop_signal(self._reactor)


def makeService(options: Options) -> service.IService:
    from twisted.internet import reactor

    try:
        settings = config.load(os.environ, options)
        fast = None
        if config.fast_paths(os.environ, options):
            # On purpose, here: process-wide patches of the libraries (``fast.paths``).
            # Imported only here: the plain gateway needs nothing of trapsandbox.fast.
            try:
                from trapsandbox.fast import paths
            except ImportError as error:
                raise ConfigError(
                    f"the fast paths are not installed ({error}): run with --plain "
                    "(SANDBOX_FAST_PATHS=0)"
                ) from None
            fast = paths.install(config.fast_paths_without(os.environ))
        gateway = build(settings, reactor, Notifier.from_environ(reactor, os.environ), fast)
        gateway.reload_on_sighup = True
    except ConfigError as error:
        raise SystemExit(f"trapsandbox: {error}") from None
    # Everything loaded so far lives as long as the process: keep the cyclic
    # collector from walking it again and again, and let it run less often
    # (measured: a fifth of a health round trip's CPU went to collections).
    gc.collect()
    gc.freeze()
    gc.set_threshold(limits.GC_THRESHOLD, 10, 10)
    return gateway
