"""
Several opencode servers (``OPENCODE_URL`` a list): which one a computer's
asks go to, and the health of them all.

Each computer's asks go to one server, so its conversation stays where
opencode keeps it: the first of the servers ranked for it by rendezvous
hashing (``ranked``: a digest of the server's URL, the account and the
traposId, highest first).  Every gateway process ranks the same way with the
same list, so in cluster mode a computer gets the same server whichever
process holds it; and a server added or removed moves only the computers
that ranked it first.  A server whose event stream cannot be opened is passed
over for the next in the computer's ranking (``asks``); its computers'
conversations start afresh there, and the player is told so.

Each server is probed on its own; ``ServerProbes`` answers ``/health`` and
``probe_gateway`` for them all: opencode is ok while one of them is, and the
detail says which are down.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.opencode.client import opencode_error
from trapsandbox.opencode.directories import AskDirectories, directory_name
from trapsandbox.opencode.events import EventStream
from trapsandbox.opencode.instances import Instances
from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult, redact

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

    from trapsandbox.opencode.client import OpencodeClient
    from trapsandbox.opencode.tokens import AskTokens, Key


@attrs.define(eq=False)
class Server:
    """One opencode server and what the gateway keeps of it for asks."""

    client: OpencodeClient
    stream: EventStream
    directories: AskDirectories
    # Set once the server exists: its instances are given back through its own client.
    instances: Instances = attrs.field(init=False)
    # The ``managed.Managed`` running it, when the gateway runs it (OPENCODE_URL unset).
    managed: Any = None
    # ``has_model``: yes once opencode said it has a provider (until its stream reconnects),
    # or the asks waiting for its answer.
    _has_model: bool = attrs.field(default=False, init=False)
    _model_waiters: list[Deferred] | None = attrs.field(default=None, init=False)

    @classmethod
    def build(
        cls,
        client: OpencodeClient,
        clock: IReactorTime,
        directory: str,
        tokens: AskTokens,
        instance_idle: float = limits.ASK_INSTANCE_IDLE,
        max_instances: int = limits.ASK_MAX_INSTANCES,
        managed: Any = None,
    ) -> Server:
        """The server at ``client``'s URL: its event stream, the computers' directories
        under ``directory`` (their MCP blocks holding ``tokens``), its instances' bound."""
        directories = AskDirectories(directory, client, tokens, clock)
        server = cls(client, EventStream(client, clock), directories, managed=managed)
        if managed is not None:
            # Ready once it answers a call, not at its "listening on" line.
            managed.answering = lambda: client.call("GET", "/global/health").addTimeout(
                limits.OPENCODE_READY_PROBE, clock
            )
        server.instances = Instances(clock, server.dispose, instance_idle, max_instances)
        if managed is not None:
            managed.instances = lambda: len(server.instances.live)
            # Each start looks at its model anew before it takes asks: a fresh opencode loads
            # its providers then (1.3-1.6 s here, which its first ask waited for: a new
            # computer's first text after a recycle 1.8-2.1 s, 0.7 s with this), and the
            # operator may have changed its configuration meanwhile.
            managed.warming = server._look_at_model
        else:
            # opencode reconnected may be opencode restarted, with another configuration.
            server.stream.on_reconnect.append(server._forget_model)
        return server

    @property
    def url(self) -> str:
        return self.client.url

    def dispose(self, key: Key) -> Deferred:
        """Give ``key``'s opencode instance back; its ``opencode.json`` brings it back as it
        was."""
        return self.client.dispose(os.path.join(self.directories.root, directory_name(*key)))

    def has_model(self) -> Deferred[None]:
        """
        Fires once opencode has a model provider (``GET /config/providers`` lists one); fails
        with an ``opencode_error`` saying how the operator gives it one when it has none (a
        prompt would otherwise fail with opencode's "Unexpected server error").  The asks that
        ask at once share one call; a yes is kept, a no asked again at the next ask.
        """
        if self._has_model:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        if self._model_waiters is not None:
            self._model_waiters.append(waiter)
            return waiter
        self._model_waiters = [waiter]
        d = self.client.call("GET", "/config/providers")
        d.addCallback(self._judge_providers)
        d.addBoth(self._tell_model_waiters)
        return waiter

    def _judge_providers(self, answer: Any) -> None:
        providers = answer.get("providers") if isinstance(answer, dict) else None
        if not isinstance(providers, list):
            raise opencode_error(
                f"opencode at {self.client.where} answered GET /config/providers without a "
                "list of providers"
            )
        if not providers:
            raise opencode_error(NO_MODEL.format(where=self.client.where))
        self._has_model = True

    def _tell_model_waiters(self, result: Failure | None) -> None:
        waiters, self._model_waiters = self._model_waiters or [], None
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(None)

    def _forget_model(self) -> None:
        self._has_model = False

    def _look_at_model(self) -> Deferred[None]:
        self._forget_model()
        return self.has_model()


# What a player's ask says when opencode has no model (docs/operations.md says the same).
NO_MODEL = (
    "the agent has no model: opencode at {where} has no model provider configured. The "
    "operator gives it one as the gateway's user (a provider's API key such as "
    "ANTHROPIC_API_KEY in the gateway's environment, `opencode auth login`, or a provider in "
    "opencode.json) and restarts the gateway"
)


def ranked(servers: Sequence[Server], account_id: str, trapos_id: str) -> list[Server]:
    """``servers`` in the order a computer's asks try them (rendezvous hashing)."""
    if len(servers) < 2:
        return list(servers)

    def weight(server: Server) -> bytes:
        return hashlib.sha256(f"{server.url}\0{account_id}\0{trapos_id}".encode()).digest()

    return sorted(servers, key=weight, reverse=True)


class ServerProbes:
    """
    The probes of several opencode servers as one (``OpencodeProbe``'s
    ``fresh`` and ``check``): ok while any server is, with
    ``opencodeServers`` listing each and ``opencodeDetail`` naming those down.
    """

    def __init__(self, probes: Sequence[OpencodeProbe]) -> None:
        self.probes = list(probes)
        self.url = ",".join(probe.url for probe in self.probes)
        # The last combination and what it was made of: every probe_gateway asks ``fresh``.
        self._last: tuple[tuple[ProbeResult, ...], ProbeResult] | None = None

    def fresh(self) -> ProbeResult | None:
        results = tuple(probe.fresh() for probe in self.probes)
        if any(result is None for result in results):
            return None
        last = self._last
        if last is None or any(a is not b for a, b in zip(last[0], results, strict=True)):
            last = self._last = (results, self._combined(list(results)))  # type: ignore[arg-type]
        return last[1]

    def check(self) -> Deferred:
        d = gatherResults([probe.check() for probe in self.probes])
        d.addCallback(self._combined)
        return d

    def _combined(self, results: list[ProbeResult]) -> ProbeResult:
        servers: list[dict[str, Any]] = []
        down = []
        for probe, result in zip(self.probes, results, strict=True):
            entry: dict[str, Any] = {"url": redact(probe.url), "ok": result.ok}
            if not result.ok:
                entry["detail"] = result.detail
                down.append(result.detail or redact(probe.url))
            servers.append(entry)
        up = len(servers) - len(down)
        detail = None
        if down:
            detail = f"{up} of {len(servers)} opencode servers up; down: " + "; ".join(
                str(why) for why in down
            )
        return ProbeResult(up > 0, detail, outcome="ok" if up else "error", servers=tuple(servers))
