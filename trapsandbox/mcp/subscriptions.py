"""
Resource subscriptions (SPEC §17): a client hears
``notifications/resources/updated {uri}`` when a resource it subscribed to
changes, and then reads it again.

    screen   trapsandbox://{traposId}/screen: from §14's screen watch, at most
             once a second; one watch per computer however many subscribers,
             started with the first and cancelled when the last goes
    file     trapsandbox://{traposId}/files/{+path}: when a write or delete
             through the gateway (any surface: MCP, §9, a restore) changes it,
             or the folder holding it (``Registry.file_listeners``: every surface's writes)

How a client subscribes depends on its revision:

    2026-07-28   ``subscriptions/listen {notifications: {resourceSubscriptions:
                 [uri, ...]}}``: the answer is a stream that stays open; its
                 first event is ``notifications/subscriptions/acknowledged`` with
                 the URIs honoured, every event carries the request's id as
                 ``_meta["io.modelcontextprotocol/subscriptionId"]``; the
                 subscription ends when the client closes the stream
    legacy       ``resources/subscribe {uri}`` / ``resources/unsubscribe``, per
                 client connection (credential and ``Mcp-Session-Id``); the
                 updates go out on that connection's ``GET /mcp`` stream

Who may subscribe to what is the resources' rule: a URI names one of the
caller's own computers (``resolve``), else it is not honoured (listen) or is
"resource not found" (subscribe), exactly as a read of it would be; a screen
needs the computer's ``screen`` capability.  A stream of the other lists
(tools, prompts, resources list changes) is acknowledged without them: they
never change while the gateway runs.
"""

from __future__ import annotations

import posixpath
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.mcp.errors import INVALID_PARAMS, INVALID_REQUEST, Invalid
from trapsandbox.mcp.jsonrpc import Call
from trapsandbox.mcp.resolve import computers
from trapsandbox.mcp.resources import locate
from trapsandbox.mcp.revision import SUBSCRIPTION_ID

log = Logger()

# At most one screen update a second per computer (§17): the screen watch's maxFps.
SCREEN_UPDATES_PER_SECOND = 1
# URIs one listen stream, or one legacy connection, may subscribe to.
MAX_URIS = 64
# Legacy connections with subscriptions kept at once: a legacy client that goes
# away never says so, so the longest-idle one's subscriptions end for a new one.
MAX_LEGACY_CONNECTIONS = 256
# A comment on a quiet listen stream this often keeps proxies from closing it.
KEEPALIVE_SECONDS = 15.0

Notify = Callable[[], None]


def _normal(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))


class _ScreenWatch:
    """
    One computer's screen watch, shared by its subscribers: a watch at ``maxFps`` 1, which
    the registry paces (``computers.screen.ScreenGate``), so an update at most once a second.
    """

    def __init__(
        self, sandbox: Sandbox, session: Any, caller: Caller, ended: Callable[[], None]
    ) -> None:
        self._ended = ended
        self.listeners: dict[int, Notify] = {}
        self.stopped = False
        self._first = True
        self._d = sandbox.watch_screen(caller, self._frame, max_fps=SCREEN_UPDATES_PER_SECOND)
        self._d.addErrback(self._failed, session.trapos_id)

    def _frame(self, frame: Any) -> None:
        if self._first:
            self._first = False  # the whole screen as it is: not a change
            return
        for notify in list(self.listeners.values()):
            notify()

    def _failed(self, failure: Failure, trapos_id: str) -> None:
        if not failure.check(CancelledError):
            log.info(
                "MCP screen subscription of {computer} ended: {error}",
                computer=trapos_id,
                error=failure.getErrorMessage(),
            )
        self.stop()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._ended()
        self._d.cancel()


class Subscriptions:
    """The resource subscriptions of every client of one gateway process."""

    def __init__(self, registry: Registry, sandbox: Sandbox, clock: IReactorTime) -> None:
        self._registry = registry
        self._sandbox = sandbox
        self._clock = clock
        self._screens: dict[tuple[str, str], _ScreenWatch] = {}
        # (account, traposId) -> watched path -> listeners: a write looks at its computer's only.
        self._files: dict[tuple[str, str], dict[str, dict[int, Notify]]] = {}
        self._next = 0
        # Legacy connections: their subscriptions (uri -> stop) and their GET stream.
        self._legacy: OrderedDict[Hashable, dict[str, Notify]] = OrderedDict()
        self._legacy_streams: dict[Hashable, Callable[[dict[str, Any]], None]] = {}
        registry.file_listeners.append(self.file_changed)

    # -- the watches ---------------------------------------------------------------------

    def _screen(self, session: Any, caller: Caller, notify: Notify) -> Notify:
        """``notify`` on each change of ``session``'s screen: one watch of it (the first
        subscriber's, ``caller``) for every subscriber."""
        key = (session.account_id, session.trapos_id)
        watch = self._screens.get(key)
        if watch is None:

            def ended() -> None:
                current = self._screens.get(key)
                if current is not None and current is watch:
                    del self._screens[key]

            watch = _ScreenWatch(self._sandbox, session, caller, ended)
            if not watch.stopped:  # (a computer that is gone ends it at once)
                self._screens[key] = watch
        self._next += 1
        number = self._next
        watch.listeners[number] = notify

        def stop() -> None:
            watch.listeners.pop(number, None)
            if not watch.listeners:
                watch.stop()

        return stop

    def _file(self, session: Any, path: str, notify: Notify) -> Notify:
        key, watched = (session.account_id, session.trapos_id), _normal(path)
        paths = self._files.setdefault(key, {})
        listeners = paths.setdefault(watched, {})
        self._next += 1
        number = self._next
        listeners[number] = notify

        def stop() -> None:
            listeners.pop(number, None)
            if not listeners and paths.get(watched) is listeners:
                del paths[watched]
            if not paths and self._files.get(key) is paths:
                del self._files[key]

        return stop

    def file_changed(self, account_id: str, trapos_id: str, path: str) -> None:
        """A write or delete changed ``path`` (a file, or a folder and all it holds)."""
        changed = _normal(path)
        for watched, listeners in list(self._files.get((account_id, trapos_id), {}).items()):
            if watched == changed or watched.startswith(changed.rstrip("/") + "/"):
                for notify in list(listeners.values()):
                    notify()

    def watching(self) -> int:
        """How many computers' screens are watched for subscribers (tests, metrics)."""
        return len(self._screens)

    def _subscribe(
        self, uri: Any, notify: Notify, caller: Caller, found: list, call: Call
    ) -> Notify:
        """
        Subscribe ``notify`` to ``uri`` among the caller's computers ``found``, or an
        ``Invalid`` as a read of it would be. Synchronous: nothing registered can be left
        behind by a caller that goes away while it runs.
        """
        session, kind, path = locate(self._registry, uri, caller, found, call.revision)
        if kind == "screen":
            if "screen" not in session.capabilities:
                raise Invalid(
                    INVALID_PARAMS,
                    f'{session.trapos_id} has not allowed "screen": its player can run '
                    '"sandbox allow screen"',
                    data={"uri": uri},
                )
            return self._screen(session, caller.at(session.account_id, session.trapos_id), notify)
        return self._file(session, path, notify)

    # -- 2026-07-28: subscriptions/listen ------------------------------------------------

    async def listen(self, params: dict[str, Any], call: Call, caller: Caller) -> dict[str, Any]:
        """A ``subscriptions/listen`` stream, open until the client closes it."""
        wanted = params.get("notifications")
        if type(wanted) is not dict:
            raise Invalid(INVALID_PARAMS, "subscriptions/listen needs notifications, an object")
        uris = wanted.get("resourceSubscriptions", [])
        if type(uris) is not list or not all(type(uri) is str for uri in uris):
            raise Invalid(INVALID_PARAMS, "resourceSubscriptions must be a list of URIs")
        if len(uris) > MAX_URIS:
            raise Invalid(INVALID_PARAMS, f"at most {MAX_URIS} resourceSubscriptions per stream")
        stream = call.stream
        if stream is None:
            raise Invalid(
                INVALID_REQUEST, "subscriptions/listen answers as text/event-stream: Accept it"
            )
        meta = {SUBSCRIPTION_ID: call.id}
        found = await computers(self._registry, caller)
        stops: list[Notify] = []
        honored: list[str] = []
        for uri in dict.fromkeys(uris):

            def notify(uri: str = uri) -> None:
                stream.send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/resources/updated",
                        "params": {"uri": uri, "_meta": meta},
                    }
                )

            try:
                stops.append(self._subscribe(uri, notify, caller, found, call))
            except Invalid:
                continue  # not honoured: left out of the acknowledgement
            honored.append(uri)
        acknowledged: dict[str, Any] = {}
        if "resourceSubscriptions" in wanted:
            acknowledged["resourceSubscriptions"] = honored
        stream.send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/subscriptions/acknowledged",
                "params": {"notifications": acknowledged, "_meta": meta},
            }
        )
        stop_keepalive = stream.keep_alive(self._clock, KEEPALIVE_SECONDS)
        try:
            await Deferred()  # until the client closes the stream (the request is cancelled)
        finally:
            stop_keepalive()
            for stop in stops:
                stop()
        return {"_meta": meta}  # pragma: no cover (never reached: only a cancel ends it)

    # -- legacy: resources/subscribe, resources/unsubscribe -------------------------------

    async def legacy(
        self,
        method: str,
        params: dict[str, Any],
        call: Call,
        caller: Caller,
    ) -> dict[str, Any]:
        uri = params.get("uri")
        connection = call.connection
        # Looked up before any bookkeeping: from here to the end nothing waits, so two
        # subscribes at once, or an eviction meanwhile, cannot lose a subscription's stop.
        found = await computers(self._registry, caller) if method == "resources/subscribe" else []
        if connection not in self._legacy and method == "resources/subscribe":
            while len(self._legacy) >= MAX_LEGACY_CONNECTIONS:
                _, oldest = self._legacy.popitem(last=False)
                for stop in oldest.values():
                    stop()
        subscribed = self._legacy.setdefault(connection, {})
        self._legacy.move_to_end(connection)
        if method == "resources/unsubscribe":
            stop = subscribed.pop(uri, None) if type(uri) is str else None
            if stop is not None:
                stop()
            if not subscribed:
                self._legacy.pop(connection, None)
            return {}
        if uri in subscribed:
            return {}
        if len(subscribed) >= MAX_URIS:
            raise Invalid(INVALID_PARAMS, f"at most {MAX_URIS} subscriptions per connection")

        def notify() -> None:
            send = self._legacy_streams.get(connection)
            if send is not None:
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/resources/updated",
                        "params": {"uri": uri},
                    }
                )

        try:
            subscribed[uri] = self._subscribe(uri, notify, caller, found, call)
        finally:
            if not subscribed:
                self._legacy.pop(connection, None)
        return {}

    def subscribed(self, connection: Hashable) -> bool:
        """Whether a legacy connection has subscriptions (its GET /mcp opens a stream)."""
        return bool(self._legacy.get(connection))

    def attach(self, connection: Hashable, send: Callable[[dict[str, Any]], None]) -> Notify:
        """A legacy connection's GET stream; the returned function detaches it."""
        self._legacy_streams[connection] = send

        def detach() -> None:
            if self._legacy_streams.get(connection) is send:
                del self._legacy_streams[connection]

        return detach
