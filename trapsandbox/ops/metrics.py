"""
The gateway's Prometheus metrics, on a registry of its own (never the
process-global one, so two gateways in one process, or two tests, never
share a counter).

Counters are ``Tally`` objects, plain integers bound once per label set,
and are turned into Prometheus counters only when scraped.  Everything that
counts, and the scrape itself, runs on the reactor thread, so they need no
lock; ``prometheus_client``'s own counters take one per ``inc()``, which
measured a fifth of the cost of handling a frame.  Values that are a count
of something the gateway already holds (computers, connections, requests in
flight) are read at scrape time instead of being kept in step.

Label values are bounded: a computer's request type is its own name only
for the types the gateway handles, and ``other`` otherwise.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from trapsandbox import errors, limits

PREFIX = "trapsandbox"

HELLO_OUTCOMES = ("ok", errors.UNAUTHORIZED, errors.BAD_REQUEST, errors.OVERLOADED)
# ``ok`` and ``error`` are answers from the computer (ok true or false); the
# rest are failures on the gateway's side, by error code.
GATEWAY_OUTCOMES = (
    "ok",
    "error",
    errors.TIMEOUT,
    errors.NOT_CONNECTED,
    errors.OVERLOADED,
    errors.TOO_LARGE,
    errors.BAD_REQUEST,
    errors.INTERNAL,
    "cancelled",
    errors.FORBIDDEN,
)
PROBE_OUTCOMES = ("ok", "unauthorized", "not_json", "http_error", "timeout", "unreachable", "error")
OTHER = "other"

# Computers answer in milliseconds to minutes (a request may wait for a player).
GATEWAY_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    limits.DEFAULT_REQUEST_TIMEOUT,
)
MCP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 50, 60)
PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Tally:
    """One counter value (one label set), counted on the reactor thread."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class Tallies:
    """A labelled counter made of ``Tally`` objects; a prometheus_client collector."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._tallies: dict[tuple[str, ...], Tally] = {}

    def labels(self, *values: str) -> Tally:
        tally = self._tallies.get(values)
        if tally is None:
            tally = self._tallies[values] = Tally()
        return tally

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        for values, tally in self._tallies.items():
            family.add_metric(values, tally.value)
        yield family

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self._name, self._documentation, labels=self._labels)]


class Durations:
    """A histogram of seconds counted in plain integers; a prometheus_client collector."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(sorted(buckets))
        # One count per bound (a value lands in the first bound at or above it), then +Inf.
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative = 0
        buckets = []
        for bound, count in zip((*self._bounds, math.inf), self._counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=buckets, sum_value=self._sum
        )

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation)]


class Metrics:
    """Every metric of one gateway, and its ``CollectorRegistry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        self._hellos = self._tallies("hellos", "hello handshakes by outcome", "outcome")
        for outcome in HELLO_OUTCOMES:
            self._hellos.labels(outcome)  # shown as 0 before the first

        received = self._tallies("frames_received", "messages from computers by event", "event")
        # Keyed by frame class, so the receive path needs no name lookup (``frame_kinds``).
        self._frames = received
        self._received: dict[type, Any] = {bytes: received.labels("binary")}
        sent = self._tallies("frames_sent", "messages to computers by event", "event")
        self._requests_sent = sent.labels("gateway_request")
        self._responses_sent = sent.labels("gateway_response")

        self._computer_requests = self._tallies(
            "computer_requests",
            "requests from computers by type and outcome (ok or an error code)",
            "type",
            "outcome",
        )
        self.computer_request_types: frozenset[str] = frozenset({"hello"})
        self.gateway_request_types: frozenset[str] = frozenset()

        gateway = self._tallies(
            "gateway_requests",
            "requests to computers by type and outcome: ok/error are the computer's answers",
            "type",
            "outcome",
        )
        self._gateway_requests = gateway
        for outcome in GATEWAY_OUTCOMES:
            gateway.labels("ping", outcome)
        self.gateway_request_seconds = Durations(
            f"{PREFIX}_gateway_request_seconds",
            "time from sending a request to a computer to its answer, timeout or loss",
            GATEWAY_BUCKETS,
        )
        self.registry.register(self.gateway_request_seconds)

        probes = self._tallies("opencode_probes", "HTTP probes of opencode by outcome", "outcome")
        self._probes = probes
        for outcome in PROBE_OUTCOMES:
            probes.labels(outcome)
        self.probe_seconds = Histogram(
            f"{PREFIX}_opencode_probe_seconds",
            "duration of an opencode probe",
            buckets=PROBE_BUCKETS,
            registry=self.registry,
        )

        self._mcp_tools: frozenset[str] = frozenset()
        self._mcp_outcomes: frozenset[str] = frozenset()
        self._mcp_calls = self._tallies(
            "mcp_tool_calls",
            "MCP tool calls by tool and outcome (ok or why not)",
            "tool",
            "outcome",
        )
        self.mcp_tool_call_seconds = Histogram(
            f"{PREFIX}_mcp_tool_call_seconds",
            "duration of an MCP tool call",
            buckets=MCP_BUCKETS,
            registry=self.registry,
        )

        self._operator_sockets = self._tallies(
            "operator_socket_connections",
            "operator WebSocket upgrades (GET /operator): open, or the refusal's HTTP status",
            "outcome",
        )
        self._operator_socket_requests = self._tallies(
            "operator_socket_requests",
            "answers sent on operator WebSockets, by the HTTP status they carry",
            "status",
        )

        self._asks = self._tallies("asks", "sandbox ask runs by outcome", "outcome")
        self._ask_outcomes: frozenset[str] = frozenset()
        self._ask_tokens = self._tallies(
            "ask_tokens", "model tokens opencode reported for asks, by kind", "kind"
        )
        self._ask_servers: _AskServers | None = None
        self._managed: _ManagedServers | None = None

    def _tallies(self, name: str, documentation: str, *labels: str) -> Tallies:
        tallies = Tallies(f"{PREFIX}_{name}", documentation, labels)
        self.registry.register(tallies)
        return tallies

    def hello(self, outcome: str) -> None:
        """Count one hello by outcome: ``ok`` or the error code it was refused with."""
        self._hellos.labels(outcome).inc()

    def frame_kinds(self, kinds: Mapping[str, type]) -> None:
        """The classes the computers' protocol decodes messages to, by their label."""
        self._received.update((cls, self._frames.labels(name)) for name, cls in kinds.items())

    def frame_received(self, kind: type) -> None:
        """Count one message by the class ``wire.decode`` gave it (``bytes``: a binary frame)."""
        self._received[kind].inc()

    def gateway_request_sent(self) -> None:
        self._requests_sent.inc()

    def gateway_response_sent(self) -> None:
        self._responses_sent.inc()

    def computer_request(self, type: str, outcome: str) -> None:
        """Count one answered computer request."""
        # Both labels are bounded (known types, error codes): few label sets.
        kind = type if type in self.computer_request_types else OTHER
        self._computer_requests.labels(kind, outcome).inc()

    def handle_types(self, types: Iterable[str]) -> None:
        """The request types the gateway handles: their own label values."""
        self.computer_request_types = frozenset({"hello", *types})

    def request_types(self, types: Iterable[str]) -> None:
        """The types of requests to computers with a label of their own (operators may send
        any type: the others are counted as one)."""
        self.gateway_request_types = frozenset(types)

    def gateway_request(self, type: str, outcome: str, seconds: float | None) -> None:
        """Count one finished request to a computer; ``seconds`` None if it never went out."""
        kind = type if type in self.gateway_request_types else OTHER
        self._gateway_requests.labels(kind, outcome).inc()
        if seconds is not None:
            self.gateway_request_seconds.observe(seconds)

    def operator_socket(self, outcome: str) -> None:
        """Count one operator WebSocket upgrade: ``open`` or the refusal's status."""
        self._operator_sockets.labels(outcome).inc()

    def operator_socket_request(self, status: int) -> None:
        """Count one answer on an operator WebSocket (statuses are a small fixed set)."""
        self._operator_socket_requests.labels(str(status)).inc()

    def mcp_labels(self, tools: Iterable[str], outcomes: Iterable[str]) -> None:
        """The MCP tools and call outcomes with label values of their own."""
        self._mcp_tools = frozenset(tools)
        self._mcp_outcomes = frozenset(outcomes)

    def mcp_tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        """Count one answered MCP tool call (an isError result is answered, with its outcome)."""
        self._mcp_calls.labels(
            tool if tool in self._mcp_tools else OTHER,
            outcome if outcome in self._mcp_outcomes else OTHER,
        ).inc()
        self.mcp_tool_call_seconds.observe(seconds)

    def ask_labels(self, outcomes: Iterable[str]) -> None:
        """The ask outcomes with label values of their own (shown as 0 before the first)."""
        self._ask_outcomes = frozenset(outcomes)
        for outcome in outcomes:
            self._asks.labels(outcome)

    def ask(self, outcome: str) -> None:
        """Count one finished ask."""
        self._asks.labels(outcome if outcome in self._ask_outcomes else OTHER).inc()

    def ask_tokens(self, input: int, output: int) -> None:
        """Add the tokens one ask used, when opencode reported them."""
        for kind, count in (("input", input), ("output", output)):
            self._ask_tokens.labels(kind).value += count

    def probe(self, outcome: str, seconds: float) -> None:
        self._probes.labels(outcome).inc()
        self.probe_seconds.observe(seconds)

    def watch(
        self,
        computers: Callable[[], int],
        connections: Callable[[], int],
        pending: Callable[[], int],
    ) -> None:
        """Gauges read when scraped."""
        r = self.registry
        Gauge(
            f"{PREFIX}_computers_connected", "computers that completed hello", registry=r
        ).set_function(computers)
        Gauge(
            f"{PREFIX}_connections_open",
            "open WebSocket connections, with or without hello",
            registry=r,
        ).set_function(connections)
        Gauge(
            f"{PREFIX}_gateway_requests_pending",
            "requests to computers waiting for an answer",
            registry=r,
        ).set_function(pending)

    def watch_cluster(self, gateways: Callable[[], int], redis_up: Callable[[], int]) -> None:
        """Cluster mode's gauges, read when scraped."""
        r = self.registry
        Gauge(
            f"{PREFIX}_cluster_gateways",
            "gateway processes in the cluster, this one included (1 while Redis is away)",
            registry=r,
        ).set_function(gateways)
        Gauge(
            f"{PREFIX}_cluster_redis_up", "1 while connected and subscribed to Redis", registry=r
        ).set_function(redis_up)

    def watch_accounts(self, counts: Callable[[], dict[str, int]]) -> None:
        """A gauge of connected computers per account, read when scraped."""
        self.registry.register(_AccountGauge(counts))

    def watch_asks(self, figures: Callable[[], Iterable[ServerFigures]]) -> None:
        """
        Asks and opencode instances per opencode server, read when scraped.  Watched
        again (a new ``Asks`` on the same metrics), the new figures replace the old.
        """
        if self._ask_servers is None:
            self._ask_servers = _AskServers(figures)
            self.registry.register(self._ask_servers)
        else:
            self._ask_servers.figures = figures

    def watch_managed(self, figures: Callable[[], Iterable[dict[str, Any]]]) -> None:
        """The opencode servers the gateway runs (``opencode.managed``), read when scraped.
        Watched again, the new figures replace the old."""
        if self._managed is None:
            self._managed = _ManagedServers(figures)
            self.registry.register(self._managed)
        else:
            self._managed.figures = figures


class _ManagedServers:
    """
    ``trapsandbox_opencode_managed_{up,pid,resident_memory_bytes}{server, state}`` and
    ``trapsandbox_opencode_managed_restarts_total{server, reason}``.
    """

    UP = f"{PREFIX}_opencode_managed_state"
    PID = f"{PREFIX}_opencode_managed_pid"
    RSS = f"{PREFIX}_opencode_managed_resident_memory_bytes"
    RESTARTS = f"{PREFIX}_opencode_managed_restarts"

    def __init__(self, figures: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self.figures = figures

    def _families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [
            GaugeMetricFamily(
                self.UP,
                "1 for the state each opencode server the gateway runs is in",
                labels=("server", "state"),
            ),
            GaugeMetricFamily(self.PID, "its process id", labels=("server",)),
            GaugeMetricFamily(self.RSS, "its resident memory", labels=("server",)),
            CounterMetricFamily(
                self.RESTARTS, "times it was started again, by why", labels=("server", "reason")
            ),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state, pid, rss, restarts = self._families()
        for each in self.figures():
            name = each["name"]
            state.add_metric((name, each["state"]), 1)
            if "pid" in each:
                pid.add_metric((name,), each["pid"])
            if "rssBytes" in each:
                rss.add_metric((name,), each["rssBytes"])
            for reason, count in each["restarts"].items():
                restarts.add_metric((name, reason), count)
        yield from (state, pid, rss, restarts)

    def describe(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        return self._families()


@attrs.frozen
class ServerFigures:
    """
    What the gateway holds for asks on one opencode server.  ``server`` is its
    URL without any user:password part (a label value: no secret in it).
    """

    server: str
    waiting: int
    running: int
    instances: int
    given_back: Mapping[str, int]
    dispose_failures: int


class _AskServers:
    """Gauges and counters of asks and opencode instances, by opencode server."""

    LABELS = ("server",)
    GAUGES = (
        ("asks_waiting", "asks waiting their turn in the gateway's queue", "waiting"),
        ("asks_running", "asks admitted from the queue and running", "running"),
        (
            "opencode_instances_live",
            "opencode instances (one per asking computer's directory) the gateway keeps",
            "instances",
        ),
    )
    GIVEN_BACK = f"{PREFIX}_opencode_instances_given_back"
    GIVEN_BACK_HELP = "opencode instances given back (POST /instance/dispose) by reason"
    FAILURES = f"{PREFIX}_opencode_instance_dispose_failures"
    FAILURES_HELP = "disposals of an opencode instance that failed (opencode down or restarted)"

    def __init__(self, figures: Callable[[], Iterable[ServerFigures]]) -> None:
        self.figures = figures

    def _families(self) -> tuple[list[GaugeMetricFamily], CounterMetricFamily, CounterMetricFamily]:
        gauges = [
            GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=self.LABELS)
            for name, documentation, _ in self.GAUGES
        ]
        given_back = CounterMetricFamily(
            self.GIVEN_BACK, self.GIVEN_BACK_HELP, labels=("server", "reason")
        )
        failures = CounterMetricFamily(self.FAILURES, self.FAILURES_HELP, labels=self.LABELS)
        return gauges, given_back, failures

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauges, given_back, failures = self._families()
        for each in self.figures():
            for family, (_, _, field) in zip(gauges, self.GAUGES, strict=True):
                family.add_metric((each.server,), getattr(each, field))
            for reason, count in each.given_back.items():
                given_back.add_metric((each.server, reason), count)
            failures.add_metric((each.server,), each.dispose_failures)
        yield from gauges
        yield given_back
        yield failures

    def describe(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        gauges, given_back, failures = self._families()
        return [*gauges, given_back, failures]


class _AccountGauge:
    """``trapsandbox_account_computers_connected{account}``: every known account, 0 included."""

    NAME = f"{PREFIX}_account_computers_connected"
    DOCUMENTATION = "computers that completed hello, by account"

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.DOCUMENTATION, labels=("account",))
        for account, count in sorted(self._counts().items()):
            family.add_metric((account,), count)
        yield family

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.DOCUMENTATION, labels=("account",))]
