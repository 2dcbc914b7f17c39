"""
The listings ``watch_computers`` sends (SPEC §14: the console's computers),
built once per scope per change and shared by every watcher of that scope.

A scope is whose computers a watcher sees (``auth.Operator.scope``: an
account, or None for the admin's every account).  A change (a computer
connecting, leaving, changing what it allows; in cluster mode another
process's computers listed anew) marks the listings stale; a burst of
changes is listed once, ``debounce`` seconds after its first.  Then each
scope with watchers is built once and, when what a watcher sees changed
(``inFlight`` aside), given to each of them as one ``Listing``, its JSON
encoded at most once.  So a change costs the gateway one listing per scope
watched plus one send per watcher, however many watchers an account holds
(and an account holds at most one per ``/operator`` socket).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import orjson
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from trapsandbox import limits

log = Logger()

# Where changes come from: each takes a listener and answers the function that stops it.
Source = Callable[[Callable[[], None]], Callable[[], None]]


@attrs.define(eq=False)
class Listing:
    """One scope's ``{"computers": [...]}`` as watchers get it, encoded once when asked."""

    body: dict[str, Any]
    _encoded: bytes | None = attrs.field(default=None, init=False)

    @property
    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = orjson.dumps(self.body)
        return self._encoded


def _shown(body: dict[str, Any]) -> dict[str, Any]:
    # ``inFlight`` changes with every request: not worth a partial by itself.
    computers = [{k: v for k, v in c.items() if k != "inFlight"} for c in body["computers"]]
    return {**body, "computers": computers}


@attrs.define(eq=False)
class _Scope:
    watchers: list[Callable[[Listing], None]] = attrs.field(factory=list)
    listing: Listing | None = None
    shown: dict[str, Any] | None = None


class Listings:
    """
    ``watch(scope, on_listing)``: ``on_listing`` hears the scope's listing now
    and after each change to what it shows.  ``build(scope)`` makes one;
    ``sources`` tell of changes, and are listened to only while someone
    watches (in cluster mode that keeps the other processes listed, and
    only then).
    """

    def __init__(
        self,
        build: Callable[[str | None], dict[str, Any]],
        sources: list[Source],
        clock: IReactorTime,
        debounce: float = limits.LISTING_DEBOUNCE,
    ) -> None:
        self._build = build
        self._sources = sources
        self._clock = clock
        self._debounce = debounce
        self._scopes: dict[str | None, _Scope] = {}
        self._stops: list[Callable[[], None]] = []
        self._timer: IDelayedCall | None = None
        # Builds since the start (the tests and the benchmark read it).
        self.builds = 0

    @property
    def watchers(self) -> int:
        return sum(len(scope.watchers) for scope in self._scopes.values())

    def watch(self, scope: str | None, on_listing: Callable[[Listing], None]) -> Callable[[], None]:
        """Start watching ``scope``; answers the function that stops it."""
        if not self._scopes:
            self._stops = [listen(self.changed) for listen in self._sources]
        state = self._scopes.get(scope)
        if state is None:
            state = self._scopes[scope] = _Scope()
        state.watchers.append(on_listing)
        if state.listing is None:
            self._refresh(scope, state)
        else:
            # Built anew for it (``inFlight`` as it is now); the others saw the scope's last.
            self.builds += 1
            self._tell([on_listing], Listing(self._build(scope)))

        def stop() -> None:
            if on_listing in state.watchers:
                state.watchers.remove(on_listing)
            if not state.watchers and self._scopes.get(scope) is state:
                del self._scopes[scope]
                if not self._scopes:
                    self._quiet()

        return stop

    def changed(self) -> None:
        """Something a listing shows may have changed: list every scope once the burst ends."""
        if self._timer is None and self._scopes:
            self._timer = self._clock.callLater(self._debounce, self._flush)

    def _flush(self) -> None:
        self._timer = None
        for scope, state in list(self._scopes.items()):
            self._refresh(scope, state)

    def _refresh(self, scope: str | None, state: _Scope) -> None:
        """Build ``scope``'s listing; its watchers hear it when what they see changed."""
        self.builds += 1
        body = self._build(scope)
        shown = _shown(body)
        if shown == state.shown:
            return
        state.shown = shown
        state.listing = Listing(body)
        self._tell(state.watchers, state.listing)

    def _tell(self, watchers: list[Callable[[Listing], None]], listing: Listing) -> None:
        for on_listing in list(watchers):
            try:
                on_listing(listing)
            except Exception:
                log.failure("a watcher of the computers failed")

    def _quiet(self) -> None:
        stops, self._stops = self._stops, []
        for stop in stops:
            stop()
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
