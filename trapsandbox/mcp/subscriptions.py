"""
Resource subscriptions (SPEC §17): a client hears
``notifications/resources/updated {uri}`` when a resource it subscribed to
changes, and then reads it again.

    screen   trapsandbox://{traposId}/screen: from §14's screen watch, at most
             once a second; one watch per computer however many subscribers,
             started with the first and cancelled when the last goes
    file     trapsandbox://{traposId}/files/{+path}: when a write or delete
             through the gateway (any surface: MCP, §9, a restore) changes it,
             or the folder holding it (``hooks.FileChanges``: every surface's writes)

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

Every listen stream and legacy connection is one stream of the account's in
the gateway's one budget (``computers.streams.StreamBudget``, kind
"subscription"), and its writes are bounded by bytes (``mcp.stream``): a
client that never reads is ended, not buffered for.  One resource named in
several spellings (``files/./a`` and ``files/a``) is one subscription: the
first spelling is honoured, the others are not.  A screen watch that ends
(the computer rebooted or left, its 24 h bound, a frame too large) tells its
subscribers: a listen stream ends with the reason, and a legacy subscription
is dropped with one last update, so that subscribing again starts a new watch.

Who may subscribe to what is the resources' rule: a URI names one of the
caller's own computers (``resolve``), else it is not honoured (listen) or is
"resource not found" (subscribe), exactly as a read of it would be; a screen
needs the computer's ``screen`` capability.  A stream of the other lists
(tools, prompts, resources list changes) is acknowledged without them: they
never change while the gateway runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox.computers.callers import Caller
from trapsandbox.computers.paths import inside
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.streams import SUBSCRIPTION, charged
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.errors import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, Invalid
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
# Told why a subscription ended without its subscriber asking (its screen watch ended).
Ended = Callable[[str], None]


def _nothing() -> None:
    return None


class _ScreenWatch:
    """
    One computer's screen watch, shared by its subscribers: a watch at ``maxFps`` 1, which
    the registry paces (``computers.screen.ScreenGate``), so an update at most once a second.
    A watch that ends by itself tells each subscriber why (``Ended``).
    """

    def __init__(
        self, sandbox: Sandbox, session: Any, caller: Caller, ended: Callable[[], None]
    ) -> None:
        self._ended = ended
        self.listeners: dict[int, tuple[Notify, Ended]] = {}
        self.stopped = False
        # Why it ended by itself, if it did.
        self.why: str | None = None
        self._first = True
        self._d = sandbox.watch_screen(caller, self._frame, max_fps=SCREEN_UPDATES_PER_SECOND)
        self._d.addErrback(self._failed, session.trapos_id)

    def _frame(self, frame: Any) -> None:
        if self._first:
            self._first = False  # the whole screen as it is: not a change
            return
        for notify, _ in list(self.listeners.values()):
            notify()

    def _failed(self, failure: Failure, trapos_id: str) -> None:
        if failure.check(CancelledError):
            self.stop()
            return
        error = failure.value
        said = error.message if isinstance(error, GatewayError) else failure.getErrorMessage()
        why = self.why = f"the screen watch of {trapos_id} ended: {said}"
        log.info("MCP screen subscription ended: {why}", why=why)
        self.stop()
        for _, ended in list(self.listeners.values()):
            ended(why)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._ended()
        self._d.cancel()


@attrs.define
class _Legacy:
    """A legacy connection with subscriptions: whose account's budget it holds, and them."""

    account: str | None
    give_back: Notify
    # uri -> (the resource it names, the function that stops it)
    subscribed: dict[str, tuple[Hashable, Notify]] = attrs.field(factory=dict)


class Subscriptions:
    """The resource subscriptions of every client of one gateway process."""

    def __init__(self, registry: Registry, sandbox: Sandbox, clock: IReactorTime) -> None:
        self._registry = registry
        self._streams = registry.streams
        self._sandbox = sandbox
        self._clock = clock
        self._screens: dict[tuple[str, str], _ScreenWatch] = {}
        # (account, traposId) -> watched path -> listeners: a write looks at its computer's only.
        self._files: dict[tuple[str, str], dict[str, dict[int, Notify]]] = {}
        self._next = 0
        # Legacy connections with subscriptions, the least recently used first; and the GET
        # stream of each (only a connection with subscriptions has one).
        self._legacy: OrderedDict[Hashable, _Legacy] = OrderedDict()
        self._legacy_streams: dict[Hashable, tuple[Callable[[dict[str, Any]], None], Notify]] = {}
        registry.file_listeners.append(self.file_changed)

    # -- the watches ---------------------------------------------------------------------

    def _screen(self, session: Any, caller: Caller, notify: Notify, ended: Ended) -> Notify:
        """``notify`` on each change of ``session``'s screen: one watch of it (the first
        subscriber's, ``caller``) for every subscriber; ``ended`` if the watch ends."""
        key = (session.account_id, session.trapos_id)
        watch = self._screens.get(key)
        if watch is None:

            def forget() -> None:
                current = self._screens.get(key)
                if current is not None and current is watch:
                    del self._screens[key]

            watch = _ScreenWatch(self._sandbox, session, caller, forget)
            if not watch.stopped:  # (a computer that is gone ends it at once)
                self._screens[key] = watch
        self._next += 1
        number = self._next
        if watch.stopped:  # not honoured, as a read that fails is not
            raise Invalid(INVALID_PARAMS, watch.why or "the screen watch could not start")
        watch.listeners[number] = (notify, ended)

        def stop() -> None:
            watch.listeners.pop(number, None)
            if not watch.listeners:
                watch.stop()

        return stop

    def _file(self, session: Any, watched: str, notify: Notify) -> Notify:
        key = (session.account_id, session.trapos_id)
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
        """A write, delete or move changed ``path`` (a file, or a folder and all it holds;
        canonical: every request's paths are, ``hooks.FilePaths``)."""
        for watched, listeners in list(self._files.get((account_id, trapos_id), {}).items()):
            if inside(watched, path):
                for notify in list(listeners.values()):
                    notify()

    def watching(self) -> int:
        """How many computers' screens are watched for subscribers (tests, metrics)."""
        return len(self._screens)

    def _resource(self, uri: Any, caller: Caller, found: list, call: Call) -> tuple:
        """``(resource, session, kind, path)`` that ``uri`` names among the caller's computers
        ``found``, ``resource`` the same for every spelling of it; or an ``Invalid``."""
        session, kind, path = locate(self._registry, uri, caller, found, call.revision)
        # (a file's path comes canonical from ``resources.parse``)
        return (session.account_id, session.trapos_id, kind, path), session, kind, path

    def _subscribe(
        self, named: tuple, notify: Notify, ended: Ended, caller: Caller, uri: Any
    ) -> Notify:
        """
        Subscribe ``notify`` to the resource ``named`` (``_resource``), ``ended`` told if it
        ends by itself, or an ``Invalid`` as a read of it would be. Synchronous: nothing
        registered can be left behind by a caller that goes away while it runs.
        """
        _, session, kind, path = named
        if kind == "screen":
            if "screen" not in session.capabilities:
                raise Invalid(
                    INVALID_PARAMS,
                    f'{session.trapos_id} has not allowed "screen": its player can run '
                    '"sandbox allow screen"',
                    data={"uri": uri},
                )
            at = caller.at(session.account_id, session.trapos_id)
            return self._screen(session, at, notify, ended)
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
        try:
            give_back = self._streams.take(caller, SUBSCRIPTION)
        except GatewayError as refusal:
            raise Invalid(INVALID_REQUEST, refusal.message, 429) from None
        stops: list[Notify] = [give_back]
        honored: list[str] = []
        named: set[Hashable] = set()
        # Fires with why the stream ends by itself: its reader stopped, or a watch ended.
        over: Deferred[str] = Deferred()
        stream.stalled.addCallback(lambda error: over.called or over.callback(error.message))

        def ended(why: str) -> None:
            if not over.called:
                over.callback(why)

        try:
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
                    resource = self._resource(uri, caller, found, call)
                    if resource[0] in named:
                        continue  # another spelling of one already honoured
                    stops.append(self._subscribe(resource, notify, ended, caller, uri))
                except Invalid:
                    continue  # not honoured: left out of the acknowledgement
                named.add(resource[0])
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
                # Until the client closes the stream (the request is cancelled), or it ends.
                why = await over
            finally:
                stop_keepalive()
        finally:
            for stop in stops:
                stop()
        raise Invalid(INTERNAL_ERROR, f"{why}: listen again", data={"uris": honored})

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
        legacy = self._legacy.get(connection)
        subscribed = {} if legacy is None else legacy.subscribed
        if method == "resources/unsubscribe":
            held = subscribed.pop(uri, None) if type(uri) is str else None
            if held is not None:
                held[1]()
            if not subscribed:
                self._forget(connection)
            return {}
        if uri in subscribed:
            return {}
        if len(subscribed) >= MAX_URIS:
            raise Invalid(INVALID_PARAMS, f"at most {MAX_URIS} subscriptions per connection")
        resource = self._resource(uri, caller, found, call)
        if any(held[0] == resource[0] for held in subscribed.values()):
            return {}  # another spelling of one it has: one subscription
        if legacy is None:
            legacy = self._admit_legacy(connection, caller)
        subscribed = legacy.subscribed
        self._legacy.move_to_end(connection)

        def notify() -> None:
            held = self._legacy_streams.get(connection)
            if held is not None:
                held[0](
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/resources/updated",
                        "params": {"uri": uri},
                    }
                )

        def ended(why: str) -> None:
            # Dropped, so that subscribing again starts a new watch; one last update says
            # to read it again (and the read says why it cannot be).
            held = subscribed.get(uri)
            if held is not None and held[1] is stop:
                del subscribed[uri]
                notify()
                if not subscribed:
                    self._forget(connection)

        stop: Notify = _nothing
        try:
            stop = self._subscribe(resource, notify, ended, caller, uri)
            subscribed[uri] = (resource[0], stop)
        finally:
            if not subscribed:
                self._forget(connection)
        return {}

    def _admit_legacy(self, connection: Hashable, caller: Caller) -> _Legacy:
        """
        A legacy connection's first subscription: one stream of its account's
        (``StreamBudget``); past the bound, the account's own least recently used
        connection ends for it (a legacy client never says it went away), and past
        ``MAX_LEGACY_CONNECTIONS`` in all, the least recently used one.
        """
        account = charged(caller)
        try:
            give_back = self._streams.take(caller, SUBSCRIPTION)
        except GatewayError as refusal:
            oldest = next((c for c, held in self._legacy.items() if held.account == account), None)
            if oldest is None:  # its streams are all listens
                raise Invalid(INVALID_REQUEST, refusal.message, 429) from None
            self._forget(oldest)
            give_back = self._streams.take(caller, SUBSCRIPTION)
        while len(self._legacy) >= MAX_LEGACY_CONNECTIONS:
            self._forget(next(iter(self._legacy)))
        legacy = self._legacy[connection] = _Legacy(account, give_back)
        return legacy

    def _forget(self, connection: Hashable) -> None:
        """
        A legacy connection's subscriptions end, its GET stream with them (else it would stay
        open outside the budget), and its stream of the budget is given back.
        """
        legacy = self._legacy.pop(connection, None)
        if legacy is None:
            return
        for _, stop in legacy.subscribed.values():
            stop()
        stream = self._legacy_streams.pop(connection, None)
        if stream is not None:
            stream[1]()
        legacy.give_back()

    def subscribed(self, connection: Hashable) -> bool:
        """Whether a legacy connection has subscriptions (its GET /mcp opens a stream)."""
        legacy = self._legacy.get(connection)
        return legacy is not None and bool(legacy.subscribed)

    def attach(
        self, connection: Hashable, send: Callable[[dict[str, Any]], None], end: Notify
    ) -> Notify:
        """
        A legacy connection's GET stream (``end`` ends it); the returned function
        detaches it.  One per connection: a new one ends the one before.
        """
        before = self._legacy_streams.get(connection)
        self._legacy_streams[connection] = (send, end)
        if before is not None:
            before[1]()

        def detach() -> None:
            held = self._legacy_streams.get(connection)
            if held is not None and held[0] is send:
                del self._legacy_streams[connection]

        return detach
