"""
What runs around every request the registry sends to a computer, wherever it is held: one
small object each, run in the order of ``standard_hooks`` (``Registry.request``).

    ``FilePaths``     a file request's paths made canonical and checked by the one path
                      rule (``paths.request_paths``): refused, or sent, heard and shown
                      in one spelling, whichever surface sent it
    ``Counted``       the metrics: its type, its outcome and (once it went out) its latency
    ``WatchQuota``    a ``screen_watch`` or ``peripheral_events`` is one of the account's
                      long-lived streams (``streams.StreamBudget``): past the bound it is
                      refused with ``too_many_watches``; given back when it ends.  The
                      admin's are not counted, as its ``/operator`` sockets are not.
    ``ScreenPacing``  a ``screen_watch``'s frames reach the caller through a
                      ``screen.ScreenGate``: paced to its ``maxFps``, a frame too large to
                      relay ending the watch
    ``FileChanges``   a write (its last part), delete or move that succeeded is told to the
                      file listeners (MCP's resource subscribers): every surface's changes
    ``Activity``      the request in the computer's activity feed, if anyone watches it
                      (``activity``), unless its caller is quiet or another process holds it

A hook's ``start`` sees the request before it goes out (a ``Call``): it may refuse it by
raising ``GatewayError`` (the request then fails with it and no hook's end runs, so a hook
that refuses comes before any that holds something from its start), or put itself between
the request and its partial listener.  It answers what to do once the request was sent
(given its Deferred, to add callbacks to), or None.  A hook that concerns only some types
names them (``types``); the registry runs it for those only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from trapsandbox.computers.activity import ActivityFeed, outcome
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.paths import CHANGES, FILE_REQUESTS, request_paths
from trapsandbox.computers.screen import ScreenGate, max_fps
from trapsandbox.computers.session import PartialListener
from trapsandbox.computers.streams import SCREEN_AND_EVENT, StreamBudget
from trapsandbox.ops.metrics import Metrics

log = Logger()

# The streams a computer runs until cancelled, counted per account.
WATCHES = frozenset({"screen_watch", "peripheral_events"})
# Told (account, traposId, path) after a write or delete through the gateway changed a file.
FileListener = Callable[[str, str, str], None]
Sent = Callable[[Deferred], None]


@attrs.define(eq=False)
class Call:
    """One request as the registry is about to send it."""

    caller: Caller
    type: str
    payload: dict[str, Any]
    # Where its partial responses go; a hook may put itself in between.
    on_partial: PartialListener | None
    # Sent to the process holding the computer (cluster mode), which runs its own hooks too.
    relayed: bool


class RequestHook(Protocol):
    # The request types it concerns; None: every one.
    types: frozenset[str] | None

    def start(self, call: Call) -> Sent | None:
        """Before ``call`` goes out; answers what to do with its Deferred once sent."""


def by_type(hooks: list[RequestHook]) -> tuple[dict[str, tuple[RequestHook, ...]], tuple]:
    """``hooks`` in their order for each type some of them name, and for every other type:
    what ``Registry.request`` runs, looked up once per request."""
    every = tuple(hook for hook in hooks if hook.types is None)
    named = set().union(*(hook.types for hook in hooks if hook.types is not None))
    return {
        kind: tuple(hook for hook in hooks if hook.types is None or kind in hook.types)
        for kind in named
    }, every


def standard_hooks(
    clock: IReactorTime,
    metrics: Metrics,
    streams: StreamBudget,
    files: list[FileListener],
    activity: ActivityFeed,
) -> list[RequestHook]:
    """The hooks of every request, in the order they run (``start``, then each ``Sent``)."""
    return [
        FilePaths(),
        Counted(clock, metrics),
        WatchQuota(streams),
        ScreenPacing(clock),
        FileChanges(files),
        Activity(activity),
    ]


def _passed(result: object, call: Callable[[], None]) -> object:
    call()
    return result


class FilePaths:
    types = FILE_REQUESTS

    def start(self, call: Call) -> None:
        call.payload = request_paths(call.type, call.payload)


@attrs.define
class Counted:
    clock: IReactorTime
    metrics: Metrics
    types = None

    def start(self, call: Call) -> Sent:
        def sent(d: Deferred) -> None:
            # A request refused before it went out has no latency worth recording.
            started = None if d.called else self.clock.seconds()
            d.addBoth(self._count, call.type, started)

        return sent

    def _count(self, result: object, type: str, started: float | None) -> object:
        seconds = None if started is None else self.clock.seconds() - started
        self.metrics.gateway_request(type, outcome(result), seconds)
        return result


@attrs.define
class WatchQuota:
    streams: StreamBudget
    types = WATCHES

    def start(self, call: Call) -> Sent | None:
        give_back = self.streams.take(call.caller, SCREEN_AND_EVENT)
        return lambda d: d.addBoth(_passed, give_back)


@attrs.define
class ScreenPacing:
    """``on_partial`` answering False means "no room now": the frame is kept and merged
    with the next."""

    clock: IReactorTime
    types = frozenset({"screen_watch"})

    def start(self, call: Call) -> Sent | None:
        if call.on_partial is None:
            return None
        gate = ScreenGate(self.clock, max_fps(call.payload), call.on_partial)
        call.on_partial = gate.take
        return lambda d: d.addBoth(_passed, gate.stop)


def _changed_paths(kind: str, payload: dict[str, Any], answer: Any) -> tuple[str, ...]:
    """The paths a request changed, now it succeeded (canonical: ``FilePaths`` ran first): a
    delete, a write's last part, both sides of a move, the files of a ``write_files`` its
    answer says it wrote (it stops at the first that fails)."""
    if kind == "write_files":
        written = answer.get("written") if isinstance(answer, dict) else None
        if not isinstance(written, list):
            return ()
        said = {w["path"] for w in written if isinstance(w, dict) and type(w.get("path")) is str}
        return tuple(f["path"] for f in payload["files"] if f["path"] in said)
    if kind == "move_file":
        return (payload["from"], payload["to"])
    if kind == "delete_file":
        return (payload["path"],)
    part = payload.get("part")
    if kind == "write_file" and not (isinstance(part, dict) and part.get("final") is not True):
        return (payload["path"],)
    return ()


@attrs.define
class FileChanges:
    # The registry's ``file_listeners``: whoever must hear of a file changed.
    listeners: list[FileListener]
    types = CHANGES

    def start(self, call: Call) -> Sent | None:
        def sent(d: Deferred) -> None:
            if self.listeners:
                d.addCallback(self._changed, call)

        return sent

    def _changed(self, response: Any, call: Call) -> Any:
        if getattr(response, "ok", False):
            account_id, trapos_id = call.caller.key
            for path in _changed_paths(call.type, call.payload, response.payload):
                for listener in list(self.listeners):
                    try:
                        listener(account_id, trapos_id, path)
                    except Exception:
                        log.failure("a file listener failed")
        return response


@attrs.define
class Activity:
    feed: ActivityFeed
    types = None

    def start(self, call: Call) -> Sent | None:
        # A request relayed to the process holding the computer is in its activity there.
        if call.caller.quiet or call.relayed or not self.feed.watching(call.caller.key):
            return None

        def sent(d: Deferred) -> None:
            self.feed.track(call.caller.key, call.type, call.payload, d, call.caller.sender)

        return sent
