"""
An operator's request to one computer (``{type, payload?, timeoutMs?}``),
apart from how it arrived: this is the one home of its rules (who may ask,
which account's computer is meant, what a body may hold, which HTTP status
each outcome has).  ``web`` serves it for twisted.web's requests and
``fasthttp`` for the plain keep-alive requests it reads itself.

An outcome is an ``Answer``: a status, a JSON body and any extra headers;
``OperatorRequests.http`` gives one, or a Deferred of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import orjson
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.admission import auth
from trapsandbox.computers import parts, wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.screen import Room, frames_to
from trapsandbox.computers.session import describe_session, listing_key
from trapsandbox.errors import GatewayError
from trapsandbox.limits import MAX_REQUEST_TIMEOUT_MS
from trapsandbox.snapshots.service import Snapshots
from trapsandbox.web import agentcalls, filecalls, snapshotcalls
from trapsandbox.web.agentcalls import AgentCalls
from trapsandbox.web.filecalls import FileCalls
from trapsandbox.web.listings import Listing, Listings
from trapsandbox.web.snapshotcalls import SnapshotCalls
from trapsandbox.web.validation import (
    json_object,
    number,
    optional_object,
    short_string,
)

if TYPE_CHECKING:
    from trapsandbox.cluster.member import Cluster
    from trapsandbox.computers.sandbox import Sandbox
    from trapsandbox.opencode.asks import Asks

Headers = tuple[tuple[bytes, bytes], ...]


@attrs.frozen
class Answer:
    """What to answer: an HTTP status, a JSON body, and headers beside the usual ones."""

    status: int
    body: dict[str, Any]
    headers: Headers = ()

    def encoded(self) -> tuple[int, bytes, Headers]:
        """``(status, JSON bytes, headers)``; a body orjson cannot write is a 502."""
        try:
            return self.status, orjson.dumps(self.body), self.headers
        except orjson.JSONEncodeError as error:
            # orjson reads deeper nesting (1024) than it writes (254).
            failed = error_answer(
                502, errors.INTERNAL, f"the computer's answer cannot be relayed: {error}"
            )
            return failed.status, orjson.dumps(failed.body), ()


def error_answer(status: int, code: str, message: str, headers: Headers = ()) -> Answer:
    return Answer(status, errors.body(code, message), headers)


def refused(refusal: auth.Refusal) -> Answer:
    """The answer to a client that is not an operator."""
    if refusal.reason in (auth.NOT_LOOPBACK, auth.BROWSER):
        return error_answer(403, errors.FORBIDDEN, refusal.message)
    if refusal.reason == auth.THROTTLED:
        wait = b"%d" % math.ceil(refusal.wait)
        return error_answer(
            429, errors.TOO_MANY_REQUESTS, refusal.message, ((b"retry-after", wait),)
        )
    challenge = ((b"www-authenticate", b'Bearer realm="trapsandbox"'),)
    return error_answer(401, errors.UNAUTHORIZED, refusal.message, challenge)


INTERNAL = error_answer(500, "internal", "the gateway failed to handle this request")
UNSUPPORTED_MEDIA_TYPE = error_answer(
    415, "unsupported_media_type", "an operator POST takes Content-Type: application/json"
)
NO_SUCH_COMPUTER = error_answer(404, errors.NOT_FOUND, "no such computer")
REQUEST_TIMEOUT = error_answer(
    408,
    "request_timeout",
    f"the request did not arrive whole within {limits.REQUEST_DEADLINE:g} s of its first byte",
)
TOO_MANY_WAITING = error_answer(
    429,
    "too_many_requests",
    "too many connections from your address are waiting to be admitted",
)


def json_content(content_type: bytes | None) -> bool:
    """
    Whether a ``Content-Type`` value is JSON's (parameters allowed).  Every
    operator POST must say so: a web page can send a "simple" cross-origin
    POST only as text/plain, a form or multipart, never as JSON.
    """
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip(b" \t").lower()
    return media == b"application/json"


_REQUEST = '{"type", "payload"?, "timeoutMs"?}'


def parse_request(obj: dict[str, Any]) -> tuple[str, dict[str, Any], float | None]:
    """``(type, payload, timeout in seconds or None)``; raises ``bad_request``."""
    kind = short_string(obj, "type", limits.MAX_TYPE_LENGTH)
    payload = optional_object(obj, "payload")
    if payload.get("encoding") == parts.BINARY:
        # An operator's file content is base64; which form it crosses in is the gateway's.
        raise errors.bad_request('encoding must be "base64": the gateway picks how files cross')
    timeout = number(obj, "timeoutMs", MAX_REQUEST_TIMEOUT_MS, unit="milliseconds")
    return kind, payload, None if timeout is None else timeout / 1000


def rejected(error: GatewayError) -> Answer:
    """The answer to a request that failed, with the error's status and code."""
    return error_answer(error.status, error.code, error.message)


def _answered(response: wire.ComputerResponse) -> Answer:
    body: dict[str, Any] = {"ok": response.ok}
    if response.payload is not None:
        body["payload"] = response.payload
    if response.error is not None:
        body["error"] = {"code": response.error.code, "message": response.error.message}
    return Answer(200, body)


def _failed(failure: Failure) -> Answer | Failure:
    if failure.check(GatewayError):
        return rejected(failure.value)
    return failure  # cancelled (the client went away), or a bug: the caller's


def _renumbered(
    registry: Registry, tell: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    """
    ``tell`` each entry of another process's activity numbered from this
    registry's count, so that no two entries of one watch share a number.
    """
    numbers: dict[Any, int] = {}

    def renumber(entry: dict[str, Any]) -> None:
        n = numbers.get(entry.get("n")) or registry.activity.number()
        if entry.get("state") in ("started", "running"):
            numbers[entry.get("n")] = n
        else:
            numbers.pop(entry.get("n"), None)  # ended: its number is not seen again
        tell({**entry, "n": n})

    return renumber


def _after(result: object, stop: Callable[[], None]) -> object:
    stop()
    return result


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _gateway_answer(body: dict[str, Any]) -> Answer:
    return Answer(200, {"ok": True, "payload": body})


def in_scope(computers: list[dict[str, Any]], scope: str | None) -> list[dict[str, Any]]:
    """The listed ``computers`` (of every process) an operator of ``scope`` sees (None: all)."""
    if scope is None:
        return computers
    return [c for c in computers if c.get("accountId") == scope]


class OperatorRequests:
    """
    ``POST /computers/{traposId}/requests``, however it was read.  ``snapshots``: the
    gateway's (SPEC §15), for the snapshot request types and routes (``snapshotcalls``).
    ``cluster``: this process's (SPEC §13), whose watches cover every process's computers.
    ``asks`` (``agentcalls``: the console's agent) and ``sandbox`` (``filecalls``: a file
    change as one step): the gateway's; without them those types answer that they are not
    set up.
    """

    def __init__(
        self,
        registry: Registry,
        admission: auth.Admission,
        snapshots: Snapshots | None = None,
        cluster: Cluster | None = None,
        asks: Asks | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._registry = registry
        self._admission = admission
        self.snapshots = SnapshotCalls(registry, snapshots)
        self.agent = AgentCalls(registry, asks, snapshots)
        self.files = FileCalls(registry, sandbox)
        self._cluster = cluster
        sources = [registry.watch]
        if cluster is not None:
            sources.append(cluster.watch_computers)
        self.listings = Listings(self._visible, sources, registry.clock)

    @property
    def admission_state(self) -> object:
        """
        What an admitted operator's ``admit`` depends on beside the request's head and
        client: the accounts (read again by a reload, a new value each time; the admin
        token and the trusted proxies are the process's).  The same head from the same
        client under the same state is admitted as the same operator, so a connection may
        keep that decision (``fasthttp``); a refusal is never kept (it counts).
        """
        return self._admission.accounts

    @property
    def loopback_admin(self) -> bool:
        """No token is needed: loopback clients are the admin."""
        return not self._admission.operator_token_required

    def client_address(
        self, peer: object, x_forwarded_for: str | None, forwarded: str | None
    ) -> object:
        """The client behind ``peer`` (``auth.Admission.client_address``)."""
        return self._admission.client_address(peer, x_forwarded_for, forwarded)

    def listing(self, operator: auth.Operator, asked: str | None = None) -> list[dict[str, Any]]:
        """The computers ``operator`` sees (``GET /computers``' entries, this process's)."""
        return self._listing(operator.scope(asked))

    def _listing(self, scope: str | None) -> list[dict[str, Any]]:
        sessions = self._registry.of_account(scope)
        return [describe_session(s) for s in sorted(sessions, key=lambda s: s.key)]

    def watch_computers(
        self,
        operator: auth.Operator,
        asked: str | None,
        on_listing: Callable[[Listing], None],
    ) -> Deferred:
        """
        ``visible``'s listing to ``on_listing`` now and after each change
        ``operator`` can see (a computer connecting, leaving, changing what it
        allows; on another process: seen when the cluster is listed again,
        ``Presence.watch``), shared with every watcher of the same scope and
        debounced (``Listings``); a Deferred that never fires: cancelling it
        stops the watch.
        """
        stop = self.listings.watch(operator.scope(asked), on_listing)
        return Deferred(lambda _: stop())

    def visible(self, operator: auth.Operator, asked: str | None) -> dict[str, Any]:
        """
        ``{"computers": [...]}``, what ``GET /computers`` lists for ``operator``:
        this process's computers and, in cluster mode, the other processes'
        as last listed (``Cluster.elsewhere``; ``unreachableGateways`` names
        those that did not answer, whose computers are as they last were).
        """
        return self._visible(operator.scope(asked))

    def _visible(self, scope: str | None) -> dict[str, Any]:
        local = self._listing(scope)
        if self._cluster is None:
            return {"computers": local}
        here = {listing_key(c) for c in local}
        elsewhere = self._cluster.elsewhere
        computers = [{**c, "gateway": self._cluster.instance_id} for c in local] + [
            c
            for c in in_scope(elsewhere["computers"], scope)
            # (Just moved here: listed here, not as it was there.)
            if listing_key(c) not in here
        ]
        computers.sort(key=listing_key)
        body: dict[str, Any] = {"computers": computers}
        if "unreachableGateways" in elsewhere:
            body["unreachableGateways"] = elsewhere["unreachableGateways"]
        return body

    def watch_activity(
        self, caller: Caller, on_entry: Callable[[dict[str, Any]], None]
    ) -> Deferred:
        """
        ``{"activity": entry}`` to ``on_entry`` for each request sent to the
        computer, as it starts and as it ends (``activity.activity_entry``,
        with ``state``: started, then its outcome and ``durationMs``);
        cancelling the Deferred stops the watch.  One process: it never
        fires.  Cluster mode: the activity is kept where the computer is
        held, so a computer held by another process is watched there (its
        entries numbered anew here, beside what this process tracks itself:
        a snapshot taken here); the Deferred fires with the ``Answer`` that
        ends the watch: 404 when the computer leaves its process, or is
        not connected to any.
        """

        def tell(entry: dict[str, Any]) -> None:
            on_entry({"activity": entry})

        if self._cluster is not None and self._registry.find(*caller.key) is not None:
            d = self._registry.follow_activity(caller, tell)
            return d.addCallbacks(lambda _: Answer(200, {"ok": True}), _failed)
        try:
            stop = self._registry.activity.watch(caller, tell)
        except GatewayError as error:  # the account's bound
            return succeed(_failed(Failure(error)))
        if self._cluster is None:
            return Deferred(lambda _: stop())
        d = self._cluster.watch_activity(caller, _renumbered(self._registry, tell))
        d.addBoth(_after, stop)
        return d.addCallbacks(lambda _: Answer(200, {"ok": True}), _failed)

    def operator(
        self,
        address: object,
        authorization: bytes | None,
        origin: bytes | None = None,
        host: bytes | None = None,
    ) -> auth.Operator | Answer:
        """
        Who the client at ``address`` (``client_address``) is as an operator,
        or the answer to one that is not; a browser (``origin``, ``host``:
        those headers) is not the loopback admin (``auth.browser_refusal``).
        """
        operator = self._admission.operator(address, authorization)
        if not isinstance(operator, auth.Operator):
            return refused(operator)
        # With no admin token, the admin is a caller admitted for being on loopback.
        if operator.admin and self.loopback_admin:
            why = auth.browser_refusal(_text(origin), _text(host))
            if why is not None:
                return refused(auth.Refusal(auth.BROWSER, why))
        return operator

    def admit(
        self,
        method: bytes,
        address: object,
        authorization: bytes | None,
        origin: bytes | None,
        host: bytes | None,
        content_type: bytes | None,
    ) -> auth.Operator | Answer:
        """
        The decision on an operator request, from its head alone (the body
        is read only once it is admitted): ``operator``, then a POST must be
        JSON (415).
        """
        operator = self.operator(address, authorization, origin, host)
        if type(operator) is not Answer and method == b"POST" and not json_content(content_type):
            return UNSUPPORTED_MEDIA_TYPE
        return operator

    def account(self, operator: auth.Operator, trapos_id: str, asked: str | None) -> str | Answer:
        """The account whose ``trapos_id`` is meant (``auth.Operator.account_of``), or a 409."""
        try:
            return operator.account_of(self._registry, trapos_id, asked)
        except GatewayError as failure:
            return rejected(failure)

    def http(
        self,
        address: object,
        authorization: bytes | None,
        trapos_id: str,
        asked: str | None,
        body: bytes | GatewayError,
        admitted: auth.Operator | None = None,
    ) -> Answer | Deferred:
        """
        The whole request: the operator (``admitted``: already decided from
        the head, ``admit``), the account (``?account=`` is ``asked``), the
        body (or why it could not be read), then the computer.  A Deferred
        fires with the ``Answer``, or fails with ``CancelledError`` when
        cancelled and with anything else on a bug.
        """
        operator = admitted or self.operator(address, authorization)
        if type(operator) is Answer:
            return operator
        account_id = self.account(operator, trapos_id, asked)
        if type(account_id) is Answer:
            return account_id
        if isinstance(body, GatewayError):
            return rejected(body)  # not raised again: it would keep this frame too
        try:
            obj = json_object(body, _REQUEST)
        except GatewayError as error:
            return rejected(error)
        return self.send(Caller.of_operator(operator, account_id, trapos_id), obj)

    def send(
        self,
        caller: Caller,
        obj: dict[str, Any],
        on_partial: Callable[[dict[str, Any]], None] | None = None,
        room: Room | None = None,
        connection: str | None = None,
    ) -> Answer | Deferred:
        """
        ``obj`` (``{type, payload?, timeoutMs?}``) to the computer ``caller`` is
        aimed at; the answer, or a Deferred of it, as ``http``.
        ``on_partial`` hears a ``screen_watch``'s frames (``ScreenState``'s
        shape) before it, expanded only when ``room()`` (None: always) says
        there is room for one, an ``ask``'s partials as they come, and a
        ``file_write``'s progress after each part; no other type's partials are
        relayed.  The agent's types (``agentcalls.TYPES``) and the console's file
        changes (``filecalls.TYPES``) are the gateway's own:
        ``connection`` names the connection (an ``/operator`` socket) whose ``ask_cancel``
        may name its asks by their ``id`` in ``obj``.  A
        ``screen_watch`` runs up to ``SCREEN_WATCH_TIMEOUT`` unless ``timeoutMs`` says.
        The snapshot types (``snapshotcalls.TYPES``) are the gateway's own, not
        sent as they are: ``{ok, payload}`` holds what their HTTP route answers
        (``timeoutMs`` does not bound them: the service's own timeouts do).
        """
        try:
            kind, payload, timeout = parse_request(obj)
            if kind in snapshotcalls.TYPES:
                d = self.snapshots.request(kind, caller, payload)
                return d.addCallbacks(_gateway_answer, _failed)
            if kind in agentcalls.TYPES:
                d = self.agent.request(kind, caller, payload, connection, obj.get("id"), on_partial)
                return d.addCallbacks(_gateway_answer, _failed)
            if kind in filecalls.TYPES:
                d = self.files.request(kind, caller, payload, on_partial)
                return d.addCallbacks(_gateway_answer, _failed)
        except GatewayError as error:
            return rejected(error)
        relay = None
        if kind == "screen_watch":
            if timeout is None:
                timeout = limits.SCREEN_WATCH_TIMEOUT
            if on_partial is not None:
                relay = frames_to(on_partial, room)
        d = self._registry.request(caller, kind, payload, timeout, relay)
        d.addCallbacks(_answered, _failed)
        return d
