"""
A computer's activity (SPEC §14): each request sent to it, as it starts and as it ends,
told to whoever watches it (``watch_activity`` on ``/operator``, the console).

An entry names the request and never holds a file's content (``activity_entry``); each
process numbers its own.  The watches an account's token holds open at once are counted
in the one budget of every long-lived stream (``streams.StreamBudget``): past its bound a
new one fails with ``too_many_watches``.  The requests the registry sends are tracked by
its ``hooks.Activity``; the gateway's own work on a computer (an ask, a snapshot, a file
change from the console) by ``ActivityFeed.track`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.session import PartialListener
from trapsandbox.computers.streams import ACTIVITY, StreamBudget
from trapsandbox.errors import GatewayError

log = Logger()


def outcome(result: object) -> str:
    """A request's end as the metrics and the activity name it."""
    if isinstance(result, Failure):
        if result.check(GatewayError):
            return result.value.code
        if result.check(CancelledError):
            return "cancelled"
        return errors.INTERNAL
    # A computer's answer says whether it did it; the gateway's own answer (an ask's) is a payload.
    return "error" if getattr(result, "ok", True) is False else "ok"


def activity_entry(number: int, type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """
    One request in a computer's activity (SPEC §14): its number, type and
    what it names (an exec's command line, a file request's path, an eval's
    code, an ask's prompt, a snapshot's reason, the snapshot compared with or
    restored), cut to ``wire.ECHO_LIMIT``.  Never a file's
    content or anything else of the payload: only what names the request.
    """
    if type == "exec":
        args = payload.get("args")
        words = [payload.get("command"), *(args if isinstance(args, list) else ())]
        detail = " ".join(w if isinstance(w, str) else repr(w) for w in words)
    elif isinstance(payload.get("path"), str):
        detail = payload["path"]
    elif type == "eval" and isinstance(payload.get("code"), str):
        detail = payload["code"]
    elif type == "ask" and isinstance(payload.get("prompt"), str):
        detail = payload["prompt"]
    elif type == "snapshot" and isinstance(payload.get("reason"), str):
        detail = payload["reason"]
    elif type.startswith("snapshot_") and isinstance(payload.get("snapshot"), str):
        detail = payload["snapshot"]
    else:
        detail = ""
    return {"n": number, "type": type, "detail": wire.cut(detail)}


@attrs.define
class ActivityFeed:
    """The watchers of each computer's activity, by ``(accountId, traposId)``."""

    clock: IReactorTime
    # Every long-lived stream, counted per account (the registry's).
    streams: StreamBudget = attrs.field(factory=StreamBudget, repr=False)
    # (accountId, traposId) -> listeners of its requests.
    _listeners: dict[tuple[str, str], list[PartialListener]] = attrs.field(factory=dict, init=False)
    _next: int = attrs.field(default=0, init=False)

    def watching(self, key: tuple[str, str]) -> bool:
        """Whether anyone watches the activity of the computer ``key``."""
        return key in self._listeners

    def watch(self, caller: Caller, listener: PartialListener) -> Callable[[], None]:
        """
        Call ``listener`` with each request sent to the computer, when it
        starts and when it ends (``activity_entry``); answers the function
        that stops it.  Raises ``GatewayError(too_many_watches)`` when the
        account whose token ``caller`` used already has its most of them (``streams``).
        """
        key = caller.key
        give_back = self.streams.take(caller, ACTIVITY)
        listeners = self._listeners.setdefault(key, [])
        listeners.append(listener)

        def stop() -> None:
            if listener in listeners:
                listeners.remove(listener)
                give_back()
            if not listeners and self._listeners.get(key) is listeners:
                del self._listeners[key]  # (not a newer watch's list made meanwhile)

        return stop

    def number(self) -> int:
        """The next number of an activity entry here (each process counts its own)."""
        self._next += 1
        return self._next

    def track(
        self,
        key: tuple[str, str],
        type: str,
        payload: dict[str, Any],
        d: Deferred,
        sender: Sender,
    ) -> Callable[[dict[str, Any]], None]:
        """
        Tell the watchers of ``key``'s activity of the request ``d`` (sent by
        ``sender``): now, with ``state``
        "started", and when it ends (its outcome, ``durationMs``).  Answers
        the function that tells them how it goes meanwhile (``state``
        "running" and what it is given: an ask's text as it arrives).
        """
        entry = {
            **activity_entry(self.number(), type, payload),
            **sender.entry(),
        }
        self._tell(key, {**entry, "state": "started"})
        d.addBoth(self._ended, key, entry, self.clock.seconds())
        return lambda progress: self._tell(key, {**entry, "state": "running", **progress})

    def _ended(
        self, result: object, key: tuple[str, str], entry: dict[str, Any], started: float
    ) -> object:
        ms = round((self.clock.seconds() - started) * 1000)
        self._tell(key, {**entry, "state": outcome(result), "durationMs": ms})
        return result

    def _tell(self, key: tuple[str, str], entry: dict[str, Any]) -> None:
        for listener in list(self._listeners.get(key, ())):
            try:
                listener(entry)
            except Exception:
                log.failure("a watcher of a computer's activity failed")
