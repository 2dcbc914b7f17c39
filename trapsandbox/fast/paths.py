"""
The fast paths, installed on purpose: ``install`` is called by ``tap.makeService``
(and by the tests' gateways) in fast mode, the default; ``SANDBOX_FAST_PATHS=0``
or ``twistd trapsandbox --plain`` runs the gateway on Twisted, Klein and
Autobahn as they ship (``web.listener`` listens, the site routes everything).
Nothing here happens at import.

What fast mode is, each measured against the plain mode in
``docs/benchmarks.md`` ("Fast paths against the plain gateway"):

    what listens   ``front``: one look at a connection's first bytes, computers
                   and operator sockets straight to Autobahn (no twisted.web parse)
    ``fasthttp``   ``POST /computers/{id}/requests`` read off the socket
    frames         ``patches.WholeFrames`` and slots on both WebSocket protocols
                   (``fast.protocols``)
    patches        of the libraries, process-wide (``patches``): lazy Autobahn debug
                   formatting, small-frame masks, UTF-8 validation, the
                   write-through of accepted connections, direct reactor dispatch,
                   accepted connections read by the reactor's poll itself, shared
                   transport dict keys

``without`` (``SANDBOX_FAST_PATHS_WITHOUT``, for the benchmark's attribution
of a gain, not for operators) leaves out some of ``PARTS``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.internet.interfaces import IReactorTime

from trapsandbox.admission.strangers import Strangers
from trapsandbox.errors import ConfigError
from trapsandbox.fast import patches
from trapsandbox.fast.front import FrontFactory
from trapsandbox.fast.protocols import FastGatewayProtocol, FastOperatorSocket
from trapsandbox.web.listener import CountedSite

PARTS = ("front", "fasthttp", "frames", "patches")


class FastPaths:
    """What ``install`` returns: the classes and the listener fast mode serves with."""

    def __init__(self, without: Iterable[str] = ()) -> None:
        without = frozenset(without)
        unknown = without - set(PARTS)
        if unknown:
            raise ConfigError(
                f"SANDBOX_FAST_PATHS_WITHOUT: no such fast path {', '.join(sorted(unknown))} "
                f"(the fast paths are {', '.join(PARTS)})"
            )
        self.parts = tuple(part for part in PARTS if part not in without)

    def describe(self) -> str:
        """For the start's log line."""
        return ", ".join(self.parts) or "none"

    def protocols(self, gateway: Any, operator: Any) -> None:
        """The factories ``gateway`` and ``operator`` serve with the fast protocols."""
        if "frames" in self.parts:
            gateway.protocol = FastGatewayProtocol
            operator.protocol = FastOperatorSocket

    def listener(
        self,
        site: Any,
        websocket: Any,
        clock: IReactorTime,
        requests: Any,
        operator: Any,
        strangers: Strangers,
    ) -> Any:
        """What listens on every port: ``front`` (with ``fasthttp`` given ``requests``)."""
        if "front" not in self.parts:
            return CountedSite(site, clock, strangers)
        fast_requests = requests if "fasthttp" in self.parts else None
        return FrontFactory(site, websocket, clock, strangers, fast_requests, operator)


def install(without: Iterable[str] = ()) -> FastPaths:
    """
    Patch the libraries for speed (process-wide, until ``uninstall``) and
    return what fast mode serves with.
    """
    paths = FastPaths(without)
    patches.undo()  # (exactly these, if installed before with others)
    if "patches" in paths.parts:
        patches.lazy_autobahn_debug_formatting()
        patches.fast_small_frame_masks()
        patches.python_utf8_validation()
        patches.write_through_accepted_connections()
        patches.direct_reactor_dispatch()
        patches.read_accepted_connections_directly()
        patches.share_transport_dict_keys()
    return paths


def uninstall() -> None:
    """The libraries as they ship again (for the plain mode of the tests, in one process)."""
    patches.undo()
