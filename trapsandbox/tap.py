"""
``twistd trapsandbox``: its options, and the composition root (``build``: every
part of the gateway made from the settings and handed to what uses it, the
``service.GatewayService`` that starts and stops them among them).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from autobahn.twisted.resource import WebSocketResource
from treq.client import HTTPClient
from twisted.application.service import IService
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.client import Agent

from trapsandbox import config, limits, state
from trapsandbox.admission.auth import Admission
from trapsandbox.admission.reloading import AccountsFile
from trapsandbox.admission.strangers import Strangers
from trapsandbox.computers.protocol import GatewayFactory
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.session import describe_session
from trapsandbox.errors import ConfigError
from trapsandbox.handlers import ComputerRequests
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.client import OpencodeClient, OpencodePool
from trapsandbox.opencode.http import OpencodeHTTP
from trapsandbox.opencode.managed import ManagedOpencode
from trapsandbox.opencode.probe import OpencodeProbe
from trapsandbox.opencode.queue import AskQueue
from trapsandbox.opencode.servers import Server, ServerProbes
from trapsandbox.opencode.tokens import AskTokens
from trapsandbox.ops.metrics import Metrics
from trapsandbox.ops.systemd import Notifier
from trapsandbox.service import GatewayService, Listener
from trapsandbox.snapshots.askhook import AskSnapshots
from trapsandbox.snapshots.service import Snapshots
from trapsandbox.snapshots.store import SnapshotStore
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


@attrs.frozen
class Gateway:
    """
    Every part ``build`` made, by name, and the service that runs them: what twistd gets
    (``service``), and what the tests and benchmarks reach into.
    """

    service: GatewayService
    settings: config.Settings
    metrics: Metrics
    registry: Registry
    admission: Admission
    sandbox: Sandbox
    snapshots: Snapshots
    asks: Asks
    probe: Any
    factory: GatewayFactory
    cluster: Any
    operator_socket: OperatorSocketFactory
    app: GatewayApp
    site: GatewaySite
    strangers: Strangers
    listeners: list[Listener]
    managed: ManagedOpencode | None
    # Reads the accounts file again (SIGHUP): who it no longer admits closed.
    accounts: AccountsFile

    @property
    def port(self) -> int:
        """The port its first listener listens on, once started (tests, benchmarks)."""
        return self.listeners[0].port.getHost().port


def build(
    settings: config.Settings,
    reactor: Any,
    notifier: Notifier | None = None,
    fast: FastPaths | None = None,
) -> Gateway:
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
    app = GatewayApp(
        registry,
        probe,
        WebSocketResource(factory),
        requests,
        sandbox,
        McpEndpoint(registry, sandbox, metrics, before_change=asks.before_change),
        metrics,
        cluster=cluster,
        asks=asks,
        operator_socket=WebSocketResource(operator_socket),
        managed=managed,
    )
    site = GatewaySite(app.resource(), decide=app.decide)
    strangers = Strangers(limits.MAX_UNADMITTED_HTTP_PER_ADDRESS)
    if fast is None:
        listening: Any = CountedSite(site, reactor, strangers)
    else:
        fast.protocols(factory, operator_socket)
        listening = fast.listener(site, factory, reactor, requests, operator_socket, strangers)
    listeners = [Listener(reactor, port, listening) for port in settings.ports]
    metrics.watch(
        computers=lambda: len(registry),
        connections=lambda: len(factory.connections),
        pending=lambda: registry.pending,
    )

    def account_counts() -> dict[str, int]:
        counts = dict.fromkeys(admission.account_names(), 0)
        counts.update(registry.counts())
        return counts

    metrics.watch_accounts(account_counts)
    accounts_file = AccountsFile(admission, settings.accounts_file, factory, operator_socket)
    gateway = GatewayService(
        reactor,
        settings=settings,
        admission=admission,
        mode=None if fast is None else fast.describe(),
        notifier=Notifier(reactor) if notifier is None else notifier,
        listeners=listeners,
        computers=factory,
        operator_sockets=operator_socket,
        asks=asks,
        http_pool=pool,
        snapshots=snapshots,
        open_store=_snapshot_store(settings, reactor, state_dir),
        reload_accounts=accounts_file.reload,
        cluster=cluster,
        managed=managed,
    )
    return Gateway(
        service=gateway,
        settings=settings,
        metrics=metrics,
        registry=registry,
        admission=admission,
        sandbox=sandbox,
        snapshots=snapshots,
        asks=asks,
        probe=probe,
        factory=factory,
        cluster=cluster,
        operator_socket=operator_socket,
        app=app,
        site=site,
        strangers=strangers,
        listeners=listeners,
        managed=managed,
        accounts=accounts_file,
    )


def _snapshot_store(
    settings: config.Settings, reactor: Any, state_dir: str
) -> Callable[[], Deferred[SnapshotStore]]:
    """
    What opens the snapshots' store when the service starts: in the cluster's Redis,
    else SQLite in the state directory.
    """
    if settings.redis_url is not None:
        redis_url = settings.redis_url

        def redis() -> Deferred[SnapshotStore]:
            from trapsandbox.snapshots.redisstore import RedisStore

            store = RedisStore.connect(redis_url, reactor, **settings.snapshot_store_settings())
            # Calls made meanwhile wait; a Redis still away after that is said by each call.
            connected = store.wait_connected(limits.CLUSTER_CALL_TIMEOUT)
            return connected.addBoth(lambda _: store)

        return redis

    def sqlite() -> Deferred[SnapshotStore]:
        from trapsandbox.snapshots.sqlitestore import SqliteStore

        return SqliteStore.open(state_dir, reactor, **settings.snapshot_store_settings())

    return sqlite


def _opencode(
    settings: config.Settings,
    reactor: Any,
    state_dir: str,
    metrics: Metrics,
    snapshots: Snapshots,
) -> tuple[OpencodePool, Asks, Any, ManagedOpencode | None]:
    """The HTTP client to opencode, its probes (one per server), sandbox ask, and the
    opencode servers the gateway runs itself (OPENCODE_URL unset), if so."""
    ask_directory = state.prepare(
        settings.ask_directory or os.path.join(state_dir, limits.ASK_DIRECTORY_NAME),
        "SANDBOX_ASK_DIR",
    )
    pool = OpencodePool(reactor, persistent=True)
    # As many connections kept open to each opencode server as asks may run there at once, so
    # a call finds one open rather than opening a new TCP connection (its name looked up in a
    # thread, two log lines): with 2 kept, bench.ask opened ~2.5 connections per ask (102 for
    # 40 asks), with 16 about one (41).
    pool.maxPersistentPerHost = settings.ask_max_running
    agent = Agent(reactor, pool=pool, connectTimeout=limits.OPENCODE_CONNECT_TIMEOUT)
    http = HTTPClient(agent)  # the probes'
    calls = OpencodeHTTP(agent)  # the asks'
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
            OpencodeClient(calls, reactor, url, username, password),
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


def makeService(options: Options) -> IService:
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
        gateway = build(settings, reactor, Notifier.from_environ(reactor, os.environ), fast).service
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
