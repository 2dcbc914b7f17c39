"""
Requests for computers another process holds, both ways (SPEC §13).

Out: a request here for a computer held elsewhere goes to the owner's inbox
with the epoch Redis names, and its answer comes back to ours, correlated by
id, under the request's timeout plus ``CLUSTER_RELAY_MARGIN``; partial
responses are relayed before it.  Nobody listening on the owner's inbox
answers ``unavailable`` at once; giving up tells the owner to cancel.

A relay that can no longer be answered is answered ``unavailable`` (503)
within seconds, not at its timeout, and the owner is told to cancel it
(now, or once Redis is back: ``cancel_owed``):

- our inbox's connection is lost (``lost``): no answer can reach us;
- every ``CLUSTER_RELAY_CHECK_INTERVAL`` while relays are out (``_check``):
  the owner's inbox has no subscriber (the process is gone), or Redis does
  not answer within its bound;
- a heartbeat listing (``live``) no longer has the owner: its heartbeat
  expired (a process that hangs still subscribed).

The owner, losing its own inbox, cancels what it serves (``lost``): the
requester cannot hear the answer, and has answered already.

In: a request from another process runs on the computer here only if we
hold it at the epoch the sender saw (if our claim's answer is still to be
read, once it is), and its partials and answer go back to
the sender's inbox.  It runs as its caller's (``key``, ``by``, ``quiet``: the
``trapsandbox.computers.callers.Caller`` the message carries), so the
computer's activity, kept here, names who sent it.

A watch of the computer's activity (``watch: "activity"``, from an
``/operator`` ``watch_activity`` elsewhere) goes the same way: each entry
comes back as a partial, until the requester cancels it or the computer
leaves this process (``fail`` with ``not_connected``).

    {t: req, id, from, key, epoch, type, payload, timeout, by, quiet, watch?}
    {t: cancel, id, from}                         the requester gave up
    {t: partial, id, payload}                     ... then one of
    {t: res, id, ok, payload?, error?}  {t: fail, id, code, message}
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import attrs
from twisted.internet import task
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.cluster.loops import start_loop
from trapsandbox.cluster.ownership import Ownership
from trapsandbox.cluster.redis import Redis, inbox_of
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import PartialListener
from trapsandbox.errors import GatewayError

log = Logger()

# Cancels kept for when Redis is back; past that the holders' own timeouts end the rest.
_MOST_CANCELS_OWED = 10_000


def _relay_timed_out(result: object, timeout: float) -> object:
    if isinstance(result, Failure) and result.check(CancelledError):
        raise GatewayError(
            errors.TIMEOUT, f"no answer from the gateway holding the computer within {timeout:g} s"
        )
    return result


@attrs.define(eq=False)
class _Relayed:
    """A request sent to another process, waiting for its answer in our inbox."""

    deferred: Deferred
    trapos_id: str
    instance: str
    on_partial: PartialListener | None
    # The order it was sent in: a check sent after it may end it (``Relay.mark``).
    sequence: int = 0
    # Since when the heartbeat listings have not had its holder (``Relay.live``).
    missing_since: float | None = None


def _holder_gone(relay: _Relayed, why: str) -> GatewayError:
    return GatewayError(
        errors.UNAVAILABLE,
        f"the gateway holding {relay.trapos_id} ({relay.instance}) is gone: {why}",
    )


class Relay:
    """Requests sent to other processes, and requests served for them."""

    def __init__(
        self,
        registry: Registry,
        redis: Redis,
        ownership: Ownership,
        instance_id: str,
        reactor: Any,
    ) -> None:
        self._registry = registry
        self._redis = redis
        self._ownership = ownership
        self._instance_id = instance_id
        self._reactor = reactor
        self._relays: dict[str, _Relayed] = {}
        self._serving: dict[tuple[str, str], Deferred] = {}
        self._sequence = 0
        # While relays are out: the check that their holders still listen (``_check``).
        self._checking: task.LoopingCall | None = None
        # Cancels for relays given up while Redis was away: sent once it is back.
        self._cancels_owed: list[tuple[str, str]] = []

    # -- Requests for computers held elsewhere (the registry asks) ---------------------------

    def request(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
    ) -> Deferred:
        """Fires like ``Session.request``, for a computer held by another process."""
        return self._send(caller, type, payload, timeout, on_partial, {})

    def watch_activity(self, caller: Caller, listener: PartialListener) -> Deferred:
        """
        Each activity entry of a computer held by another process to
        ``listener`` (``Registry.follow_activity`` there); a Deferred that
        fails with ``not_connected`` when it leaves that process (or is not
        held anywhere); cancelling it ends the watch.
        """
        # Its sender goes along: the holder counts an account's watches against its bound.
        return self._send(
            caller,
            "watch_activity",
            {},
            limits.SCREEN_WATCH_TIMEOUT,
            listener,
            {"watch": "activity"},
        )

    def _send(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
        fields: dict[str, Any],
    ) -> Deferred:
        """The request ``{type, payload, timeout, **fields}`` of ``caller`` to the computer's
        holder."""
        if not self._redis.subscribed:
            # No answer could reach us.
            return fail(GatewayError(errors.UNAVAILABLE, "the gateway is not connected to Redis"))
        message = {
            "t": "req",
            "from": self._instance_id,
            "type": type,
            "payload": payload,
            "timeout": timeout,
            **caller.message(),
            **fields,
        }
        d = self._ownership.holder(*caller.key, within=timeout)
        d.addCallback(self._relay, message, on_partial)
        return d

    def _relay(
        self, holder: tuple[str, str], request: dict[str, Any], on_partial: PartialListener | None
    ) -> Deferred:
        instance, epoch = holder
        trapos_id, timeout = request["key"][1], request["timeout"]
        if not instance or instance == self._instance_id:
            raise wire.not_connected(trapos_id)
        relay_id = uuid.uuid4().hex
        d = Deferred(lambda _: self._relay_cancelled(relay_id))
        self._sequence += 1
        self._relays[relay_id] = _Relayed(d, trapos_id, instance, on_partial, self._sequence)
        d.addTimeout(timeout + limits.CLUSTER_RELAY_MARGIN, self._reactor, _relay_timed_out)
        d.addBoth(self._relay_done, relay_id)
        message = {**request, "id": relay_id, "epoch": epoch}
        sent = self._redis.publish(instance, message)
        sent.addCallbacks(self._relay_sent, self._relay_unsent, (relay_id,), None, (relay_id,))
        if self._checking is None and relay_id in self._relays:
            interval = limits.CLUSTER_RELAY_CHECK_INTERVAL
            self._checking = start_loop(self._check, interval, self._reactor, now=False)
        return d

    def _relay_sent(self, receivers: int, relay_id: str) -> None:
        relay = self._relays.get(relay_id)
        if relay is not None and not receivers:
            relay.deferred.errback(
                GatewayError(
                    errors.UNAVAILABLE,
                    f"the gateway holding {relay.trapos_id} ({relay.instance}) is not answering",
                )
            )

    def _relay_unsent(self, failure: Failure, relay_id: str) -> None:
        relay = self._relays.get(relay_id)
        if relay is not None:
            relay.deferred.errback(failure)

    def _relay_cancelled(self, relay_id: str) -> None:
        relay = self._relays.pop(relay_id, None)
        if relay is not None:
            message = {"t": "cancel", "id": relay_id, "from": self._instance_id}
            self._redis.publish(relay.instance, message).addErrback(lambda _: None)

    def _relay_done(self, result: object, relay_id: str) -> object:
        self._relays.pop(relay_id, None)
        return result

    # -- Relays that can no longer be answered -----------------------------------------------

    @property
    def mark(self) -> int:
        """The relays sent so far: a check started now may end only those (``live``)."""
        return self._sequence

    def _give_up(self, relays: Iterable[str], error: GatewayError) -> None:
        """Answer these relays ``error`` here, and tell their holders to cancel them."""
        for relay_id in list(relays):
            relay = self._relays.pop(relay_id, None)
            if relay is None:
                continue
            self._cancel_there(relay.instance, relay_id)
            relay.deferred.errback(error)

    def _cancel_there(self, instance: str, relay_id: str) -> None:
        def unsent(_: object) -> None:
            if len(self._cancels_owed) < _MOST_CANCELS_OWED:
                self._cancels_owed.append((instance, relay_id))

        if not self._redis.connected:
            unsent(None)
            return
        message = {"t": "cancel", "id": relay_id, "from": self._instance_id}
        self._redis.publish(instance, message).addErrback(unsent)

    def lost(self) -> None:
        """
        Our inbox's connection is lost: no answer can reach us, so every relay out
        is answered ``unavailable`` now; what we serve for others is cancelled (its
        requester has lost its answer too, or will not hear ours).
        """
        self._give_up(
            self._relays,
            GatewayError(
                errors.UNAVAILABLE,
                "the gateway lost its connection to Redis: the answer cannot reach it",
            ),
        )
        for key in list(self._serving):
            d = self._serving.pop(key, None)
            if d is not None:
                d.cancel()

    def cancel_owed(self) -> None:
        """
        Redis answers again (we are subscribed, or a heartbeat went through): tell the
        holders of the relays given up while it did not to cancel them.
        """
        if not self._cancels_owed or not self._redis.ok:
            return
        owed, self._cancels_owed = self._cancels_owed, []
        for instance, relay_id in owed:
            self._cancel_there(instance, relay_id)

    def live(self, instances: set[str], mark: int, at: float, ttl: float) -> None:
        """
        ``instances`` are the live processes by a heartbeat listing started at
        ``at``, when ``mark`` relays were sent: those sent before it to a process
        missing from every listing for ``ttl`` (its heartbeat expired: a process
        that hangs, still subscribed) are answered ``unavailable``.  One listing
        is not enough: after Redis restarts empty, a process writes its ownerships
        and its heartbeat at their own intervals.
        """
        for relay_id, relay in list(self._relays.items()):
            if relay.sequence > mark:
                continue
            if relay.instance in instances:
                relay.missing_since = None
            elif relay.missing_since is None:
                relay.missing_since = at
            elif at - relay.missing_since >= ttl:
                self._give_up([relay_id], _holder_gone(relay, "its heartbeat expired"))

    def _check(self) -> Deferred | None:
        """While relays are out: does each one's holder still listen, and Redis answer?"""
        if not self._relays:
            loop, self._checking = self._checking, None
            if loop is not None and loop.running:
                loop.stop()
            return None
        if not self._redis.ok:
            self.lost()
            return None
        mark = self._sequence
        instances = sorted({relay.instance for relay in self._relays.values()})
        channels = [inbox_of(instance) for instance in instances]
        d = self._redis.call("execute_command", "PUBSUB", "NUMSUB", *channels)
        d.addCallbacks(self._checked, self._check_failed, (instances, mark), None, (mark,))
        return d

    def _checked(self, reply: list[Any], instances: list[str], mark: int) -> None:
        counts = dict(zip(reply[::2], reply[1::2], strict=True))
        listening = {i for i in instances if int(counts.get(inbox_of(i), 0))}
        for relay_id, relay in list(self._relays.items()):
            if relay.sequence <= mark and relay.instance not in listening:
                self._give_up([relay_id], _holder_gone(relay, "it no longer listens"))

    def _check_failed(self, failure: Failure, mark: int) -> None:
        failure.trap(GatewayError)
        log.warn("cluster: relayed requests given up: {error}", error=failure.value.message)
        error = GatewayError(
            errors.UNAVAILABLE, f"cannot relay the answer: {failure.value.message}"
        )
        self._give_up([i for i, r in self._relays.items() if r.sequence <= mark], error)

    def stop(self) -> None:
        """Leaving the cluster: no relay can be answered any more."""
        if self._checking is not None and self._checking.running:
            self._checking.stop()
        self._checking = None
        self._give_up(self._relays, GatewayError(errors.UNAVAILABLE, "the gateway is stopping"))

    def on_partial(self, message: dict[str, Any]) -> None:
        """``{t: partial}``: a partial response to a request of ours."""
        relay = self._relays.get(message["id"])
        payload = message.get("payload")
        if relay is not None and relay.on_partial is not None and type(payload) is dict:
            try:
                relay.on_partial(payload)
            except GatewayError as error:
                # The listener ends it (as Registry.request's do): there, and for its caller.
                self._relay_cancelled(message["id"])
                relay.deferred.errback(error)
            except Exception:
                log.failure("a listener of relayed output failed")

    def on_answer(self, message: dict[str, Any]) -> None:
        """``{t: res}`` or ``{t: fail}``: the end of a request of ours."""
        relay = self._relays.pop(message["id"], None)
        if relay is None:
            return
        if message["t"] == "fail":
            error = GatewayError(str(message.get("code")), str(message.get("message")))
            relay.deferred.errback(error)
            return
        error = message.get("error")
        relay.deferred.callback(
            wire.ComputerResponse(
                relay.trapos_id,
                message["id"],
                str(message.get("type") or "?"),
                bool(message.get("ok")),
                message.get("payload"),
                errors.Error(str(error.get("code")), str(error.get("message")))
                if type(error) is dict
                else None,
            )
        )

    # -- Requests from other processes for computers held here -------------------------------

    def on_request(self, message: dict[str, Any]) -> None:
        """``{t: req}``: run it on the computer here if we hold it at the sender's epoch."""
        sender, relay_id = str(message["from"]), str(message["id"])
        caller = Caller.from_message(message)
        account_id, trapos_id = caller.key
        session = self._registry.find(account_id, trapos_id)
        epoch = self._ownership.epoch_of(session) if session is not None else None
        if epoch is None and session is not None:
            answered = self._ownership.claim_answered(session)
            if answered is not None:  # decided once we know our epoch; cancelled meanwhile: dropped
                self._serving[(sender, relay_id)] = answered
                answered.addCallbacks(self._claim_answered, lambda _: None, (answered, message))
                return
        timeout = message.get("timeout")
        if epoch is None or str(epoch) != str(message.get("epoch")):
            self._answer(sender, relay_id, wire.not_connected(trapos_id))
            return
        if type(timeout) not in (int, float) or not 0 < timeout <= limits.MAX_REQUEST_TIMEOUT:
            self._answer(sender, relay_id, GatewayError(errors.BAD_REQUEST, "bad relayed timeout"))
            return
        payload = message.get("payload")

        def partial(answer: dict[str, Any]) -> None:
            part = {"t": "partial", "id": relay_id, "payload": answer}
            self._redis.publish(sender, part).addErrback(lambda _: None)

        if message.get("watch") == "activity":
            d = self._registry.follow_activity(caller, partial)
            # At its bound it just stops (cancelled: nothing sent); the requester's own
            # bound, a margin later, answers there.
            d.addTimeout(timeout, self._reactor, lambda result, _: result)
        else:
            d = self._registry.request(
                caller,
                str(message.get("type")),
                payload if type(payload) is dict else {},
                timeout,
                on_partial=partial,
            )
        self._serving[(sender, relay_id)] = d
        d.addBoth(self._served, sender, relay_id)

    def _claim_answered(self, _: None, answered: Deferred, message: dict[str, Any]) -> None:
        key = (str(message["from"]), str(message["id"]))
        if self._serving.get(key) is answered:  # (a peer's repeated id took its place: not run)
            del self._serving[key]
            self.on_request(message)

    def _served(self, result: object, sender: str, relay_id: str) -> None:
        self._serving.pop((sender, relay_id), None)
        if isinstance(result, Failure):
            if result.check(CancelledError):
                return None  # the requester cancelled: nobody waits
            if result.check(GatewayError):
                self._answer(sender, relay_id, result.value)
            else:
                log.failure("a relayed request failed", result)
                self._answer(sender, relay_id, GatewayError(errors.INTERNAL, "the gateway failed"))
            return None
        response: wire.ComputerResponse = result
        answer: dict[str, Any] = {
            "t": "res",
            "id": relay_id,
            "type": response.type,
            "ok": response.ok,
            "payload": response.payload,
        }
        if response.error is not None:
            answer["error"] = {"code": response.error.code, "message": response.error.message}
        self._redis.publish(sender, answer).addErrback(lambda _: None)
        return None

    def _answer(self, sender: str, relay_id: str, error: GatewayError) -> None:
        message = {"t": "fail", "id": relay_id, "code": error.code, "message": error.message}
        self._redis.publish(sender, message).addErrback(lambda _: None)

    def on_cancel(self, message: dict[str, Any]) -> None:
        """``{t: cancel}``: the requester gave up; stop serving its request."""
        d = self._serving.pop((str(message["from"]), str(message["id"])), None)
        if d is not None:
            d.cancel()
