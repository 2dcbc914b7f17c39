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
from twisted.internet.defer import Deferred, gatherResults

from trapsandbox import limits
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
        return server

    @property
    def url(self) -> str:
        return self.client.url

    def dispose(self, key: Key) -> Deferred:
        """Give ``key``'s opencode instance back; its ``opencode.json`` brings it back as it
        was."""
        return self.client.dispose(os.path.join(self.directories.root, directory_name(*key)))


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
