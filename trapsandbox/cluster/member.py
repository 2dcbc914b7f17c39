"""
Cluster mode (SPEC §13): several gateway processes, behind any load balancer,
act as one by sharing presence and routing requests through Redis.

Imported only when ``SANDBOX_REDIS_URL`` is set.  Redis holds, under
``CLUSTER_PREFIX``, with ``<key>`` the JSON ``["accountId", "traposId"]``:

    instances          the set of process ids (the heartbeat prunes dead ones)
    instance:<id>      a process's heartbeat {id, computers, version}, with a TTL
    epoch:<key>        a computer's epoch counter: each hello INCRs it (a
                       fencing token; "newest" is the hello Redis ran last)
    owner:<key>        "<instance>|<epoch>" with a TTL, refreshed in batches
    inbox:<id>         a process's pub/sub channel

and every change to them is one Lua script (``CLAIM``, ``REFRESH``,
``RELEASE``, ``HEARTBEAT``), so no two processes interleave.  Inbox messages
are JSON objects; pub/sub is fire-and-forget, so none carries state that a
lost message would leave wrong (the refresh heals a lost eviction):

    {t: evict, key, epoch}                        a newer hello elsewhere
    {t: req, id, from, key, epoch, type, payload, timeout}
    {t: cancel, id, from}                         the requester gave up
    {t: partial, id, payload}                     ... then one of
    {t: res, id, ok, payload?, error?}  {t: fail, id, code, message}
    {t: list, id, from}   ->   {t: listed, id, from, computers}

Redis down: computers connected here keep working (nothing on their path
waits for Redis), requests for computers elsewhere fail with
``unavailable`` (503) at once or within ``CLUSTER_CALL_TIMEOUT``, and both
connections come back by themselves; the refresh then writes this process's
ownerships again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import orjson
import txredisapi
from hyperlink import URL
from twisted.internet import endpoints, task
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredList,
    fail,
    succeed,
)
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import __version__, limits
from trapsandbox.computers import wire
from trapsandbox.computers.registry import PartialListener, Registry, Session
from trapsandbox.computers.wire import GatewayError

log = Logger()

# KEYS: epoch, owner.  ARGV: instance, owner TTL (ms).  -> {epoch, previous owner or ""}
CLAIM = """
local epoch = redis.call('INCR', KEYS[1])
local previous = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
return {epoch, previous or ''}
"""

# KEYS: owner 1, epoch 1, owner 2, epoch 2, ...  ARGV: instance, owner TTL (ms),
# epoch 1, epoch 2, ...  -> {1 (still ours) or 0 (taken: close ours), ...}
# A key that is gone (Redis restarted empty, or it expired) is ours again,
# unless a newer hello took the counter past ours meanwhile; the counter is
# raised to at least our epoch, so fencing tokens never go backwards.
REFRESH = """
local out = {}
for i = 1, #KEYS / 2 do
  local owner, counter, epoch = KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[2 + i])
  local mine = ARGV[1] .. '|' .. epoch
  local current = redis.call('GET', owner)
  if current == mine then
    redis.call('PEXPIRE', owner, ARGV[2])
    out[i] = 1
  elseif current then
    out[i] = 0
  else
    local counted = tonumber(redis.call('GET', counter) or '0')
    if counted > epoch then
      out[i] = 0
    else
      redis.call('SET', counter, epoch)
      redis.call('SET', owner, mine, 'PX', ARGV[2])
      out[i] = 1
    end
  end
end
return out
"""

# KEYS: owner.  ARGV: "<instance>|<epoch>".  Compare and delete.  -> 1 if deleted
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: instances.  ARGV: instance, heartbeat, TTL (ms), heartbeat key prefix.
# -> the heartbeats of every live process (this one's included)
HEARTBEAT = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SET', ARGV[4] .. ARGV[1], ARGV[2], 'PX', ARGV[3])
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local beat = redis.call('GET', ARGV[4] .. id)
  if beat then out[#out + 1] = beat else redis.call('SREM', KEYS[1], id) end
end
return out
"""

# KEYS: instances, heartbeat.  ARGV: instance.  A clean stop.
LEAVE = """
redis.call('SREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2])
"""


@attrs.frozen
class RedisAddress:
    host: str
    port: int
    db: int
    password: str | None = attrs.field(repr=False)

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        parsed = URL.from_text(url)
        db = parsed.path[0] if parsed.path and parsed.path[0] else "0"
        password = parsed.userinfo.partition(":")[2] or None if parsed.userinfo else None
        return cls(parsed.host, parsed.port or 6379, int(db), password)


def computer_key(account_id: str, trapos_id: str) -> str:
    return orjson.dumps([account_id, trapos_id]).decode()


class _InboxProtocol(txredisapi.SubscriberProtocol):
    def connectionMade(self):
        d = super().connectionMade()
        # Every (re)connection subscribes again: a new connection has no channels.
        self.whenConnected().addCallback(self.factory.cluster._inbox_connected)
        return d

    def messageReceived(self, pattern, channel, message) -> None:
        self.factory.cluster._inbox_message(message)

    def connectionLost(self, why) -> None:
        self.factory.cluster.subscribed = False
        super().connectionLost(why)


class _InboxFactory(txredisapi.SubscriberFactory):
    protocol = _InboxProtocol


def _relay_timed_out(result: object, timeout: float) -> object:
    if isinstance(result, Failure) and result.check(CancelledError):
        raise GatewayError(
            wire.TIMEOUT, f"no answer from the gateway holding the computer within {timeout:g} s"
        )
    return result


def _ignore_cancel(failure: Failure) -> None:
    failure.trap(CancelledError)


@attrs.define(eq=False)
class _Relay:
    """A request sent to another process, waiting for its answer in our inbox."""

    deferred: Deferred
    trapos_id: str
    instance: str
    on_partial: PartialListener | None


@attrs.define(eq=False)
class _Listing:
    deferred: Deferred
    waiting: set[str]
    computers: list[dict[str, Any]] = attrs.field(factory=list)


class Cluster:
    """
    This process's part of a cluster: the registry's ``peers``.  ``describe``
    turns a session into its ``/computers`` entry.
    """

    def __init__(
        self,
        registry: Registry,
        url: str,
        reactor: Any,
        describe: Callable[[Session], dict[str, Any]],
        refresh_interval: float = limits.CLUSTER_REFRESH_INTERVAL,
        call_timeout: float = limits.CLUSTER_CALL_TIMEOUT,
        instance_id: str | None = None,
    ) -> None:
        self._registry = registry
        self._address = RedisAddress.from_url(url)
        self._reactor = reactor
        self._describe = describe
        self.instance_id = instance_id or uuid.uuid4().hex[:16]
        self.refresh_interval = refresh_interval
        self._owner_ttl_ms = int(refresh_interval * limits.CLUSTER_OWNER_TTL_FACTOR * 1000)
        self.heartbeat_interval = min(limits.CLUSTER_HEARTBEAT_INTERVAL, refresh_interval)
        self._heartbeat_ttl_ms = int(
            self.heartbeat_interval * limits.CLUSTER_HEARTBEAT_TTL_FACTOR * 1000
        )
        self._call_timeout = call_timeout
        prefix = limits.CLUSTER_PREFIX
        self._prefix = prefix
        self._instances_key = prefix + "instances"
        self._heartbeat_prefix = prefix + "instance:"
        self.inbox = self.inbox_of(self.instance_id)
        # What this process holds: key -> (session, epoch).
        self._owned: dict[str, tuple[Session, int]] = {}
        self._claiming: set[Session] = set()
        # Evictions that arrived before our own claim's answer: key -> epoch.
        self._evicted: dict[str, int] = {}
        self._relays: dict[str, _Relay] = {}
        self._serving: dict[tuple[str, str], Deferred] = {}
        self._listings: dict[str, _Listing] = {}
        # The live processes, from the last heartbeat (empty while Redis is down).
        self.instances: list[dict[str, Any]] = []
        self.subscribed = False
        self._commands: Any = None
        self._inbox: _InboxFactory | None = None
        self._loops: list[task.LoopingCall] = []

    def inbox_of(self, instance: str) -> str:
        return f"{self._prefix}inbox:{instance}"

    def _owner_key(self, key: str) -> str:
        return f"{self._prefix}owner:{key}"

    def _epoch_key(self, key: str) -> str:
        return f"{self._prefix}epoch:{key}"

    # -- Starting and stopping ---------------------------------------------------------------

    def start(self) -> None:
        address = self._address
        self._commands = txredisapi.lazyConnectionPool(
            address.host,
            address.port,
            dbid=address.db,
            poolsize=1,
            password=address.password,
            connectTimeout=self._call_timeout,
            replyTimeout=self._call_timeout,
            convertNumbers=False,
        )
        self._inbox = _InboxFactory(isLazy=True)
        self._inbox.cluster = self
        self._inbox.password = address.password
        for factory in (self._commands._factory, self._inbox):
            # txredisapi backs off to 10 s by default; Redis restarting is short.
            factory.initialDelay = limits.CLUSTER_RECONNECT_INITIAL_DELAY
            factory.maxDelay = limits.CLUSTER_RECONNECT_MAX_DELAY
        self._inbox.startConnecting(
            endpoints.HostnameEndpoint(
                self._reactor, address.host, address.port, timeout=self._call_timeout
            )
        )
        for what, interval in (
            (self._heartbeat, self.heartbeat_interval),
            (self._refresh, self.refresh_interval),
        ):
            loop = task.LoopingCall(self._never_fails, what)
            loop.clock = self._reactor
            self._loops.append(loop)
            loop.start(interval, now=False)
        # The first heartbeat as soon as Redis answers, not one interval later.
        self._commands._factory.deferred.addCallback(lambda _: self._never_fails(self._heartbeat))
        log.info(
            "cluster mode: gateway {instance} on Redis {host}:{port}/{db}",
            instance=self.instance_id,
            host=address.host,
            port=address.port,
            db=address.db,
        )

    def stop(self) -> Deferred:
        """Leave the cluster (best effort, bounded) and close both connections."""
        for loop in self._loops:
            if loop.running:
                loop.stop()
        d = self._call(
            "eval",
            LEAVE,
            [self._instances_key, self._heartbeat_prefix + self.instance_id],
            [self.instance_id],
        )
        d.addErrback(lambda _: None)
        d.addCallback(lambda _: self._disconnect())
        return d

    def _disconnect(self) -> Deferred:
        ds = []
        if self._commands is not None:
            ds.append(self._commands.disconnect())
        if self._inbox is not None:
            ds.append(self._inbox.disconnect())
        d = DeferredList(ds, consumeErrors=True)
        d.addTimeout(self._call_timeout, self._reactor)
        d.addErrback(lambda _: None)
        return d

    # -- Redis calls: every one bounded ------------------------------------------------------

    @property
    def connected(self) -> bool:
        # txredisapi would queue a command until Redis is back: refuse at once instead.
        return self._commands is not None and self._commands._factory.size > 0

    def _call(self, method: str, *args: Any) -> Deferred:
        if not self.connected:
            return fail(GatewayError(wire.UNAVAILABLE, "the gateway is not connected to Redis"))
        try:
            d = getattr(self._commands, method)(*args)
        except Exception:
            return fail(GatewayError(wire.UNAVAILABLE, "the gateway cannot reach Redis"))
        d.addTimeout(self._call_timeout, self._reactor)
        d.addErrback(self._redis_failed, method)
        return d

    def _redis_failed(self, failure: Failure, method: str) -> Failure:
        if failure.check(GatewayError):
            return failure
        if failure.check(CancelledError):
            message = f"Redis did not answer within {self._call_timeout:g} s"
        else:
            message = f"Redis failed: {failure.getErrorMessage()}"
        return Failure(GatewayError(wire.UNAVAILABLE, message))

    def _publish(self, instance: str, message: dict[str, Any]) -> Deferred:
        """Fires with the number of receivers (0: that process is gone)."""
        return self._call("publish", self.inbox_of(instance), orjson.dumps(message))

    def _never_fails(self, what: Callable[[], Deferred | None]) -> Deferred:
        # A LoopingCall stops for good at its first failure.
        try:
            d = what()
        except Exception:
            log.failure("cluster: {what} failed", what=what.__name__)
            return succeed(None)
        if d is None:
            return succeed(None)
        d.addErrback(self._loop_failed, what.__name__)
        return d

    def _loop_failed(self, failure: Failure, what: str) -> None:
        if failure.check(GatewayError):
            log.warn("cluster: {what}: {message}", what=what, message=failure.value.message)
        else:
            log.failure("cluster: {what} failed", failure, what=what)

    # -- The inbox ---------------------------------------------------------------------------

    def _inbox_connected(self, protocol: _InboxProtocol) -> None:
        d = protocol.subscribe(self.inbox)
        d.addTimeout(self._call_timeout, self._reactor)
        d.addCallbacks(self._subscribed, self._subscribe_failed, errbackArgs=(protocol,))

    def _subscribed(self, _: object) -> None:
        self.subscribed = True
        log.info("cluster: listening on {inbox}", inbox=self.inbox)
        # Back after an outage: write the heartbeat and our ownerships now.
        self._never_fails(self._heartbeat)
        self._never_fails(self._refresh)

    def _subscribe_failed(self, failure: Failure, protocol: _InboxProtocol) -> None:
        log.warn("cluster: cannot subscribe to our inbox: {error}", error=failure.getErrorMessage())
        protocol.transport.abortConnection()  # reconnects, and tries again

    def _inbox_message(self, message: str | bytes) -> None:
        try:
            obj = orjson.loads(message)
            handler = self._handlers.get(obj.get("t")) if type(obj) is dict else None
            if handler is None:
                log.warn("cluster: ignored an inbox message that is not ours")
                return
            handler(self, obj)
        except Exception:
            log.failure("cluster: an inbox message failed")

    # -- Ownership (the registry tells us) ---------------------------------------------------

    def added(self, session: Session) -> None:
        self._claim(session)

    def removed(self, session: Session) -> None:
        key = computer_key(*session.key)
        owned = self._owned.get(key)
        if owned is not None and owned[0] is session:
            del self._owned[key]
            self._release(key, owned[1])

    def _claim(self, session: Session) -> None:
        key = computer_key(*session.key)
        self._claiming.add(session)
        d = self._call(
            "eval",
            CLAIM,
            [self._epoch_key(key), self._owner_key(key)],
            [self.instance_id, self._owner_ttl_ms],
        )
        d.addCallbacks(self._claimed, self._claim_failed, (session, key), None, (session, key))
        d.addErrback(lambda failure: log.failure("cluster: claiming a computer failed", failure))

    def _claimed(self, reply: list[Any], session: Session, key: str) -> None:
        self._claiming.discard(session)
        epoch, previous = int(reply[0]), reply[1]
        evicted = self._evicted.pop(key, 0)
        if self._registry.find(session.trapos_id, session.account_id) is not session:
            self._release(key, epoch)  # it left (or was replaced) while we claimed it
            return
        if evicted > epoch:
            self._replaced(session, epoch, evicted)
            return
        self._owned[key] = (session, epoch)
        if previous:
            instance, _, _ = previous.rpartition("|")
            if instance != self.instance_id:
                d = self._publish(instance, {"t": "evict", "key": session.key, "epoch": epoch})
                d.addErrback(lambda _: None)  # it is gone; or the refresh tells it

    def _claim_failed(self, failure: Failure, session: Session, key: str) -> None:
        self._claiming.discard(session)
        self._evicted.pop(key, None)
        # The computer works here; the next refresh claims it once Redis answers.
        log.warn(
            "cluster: {traposId} is reachable only here for now: {error}",
            traposId=session.trapos_id,
            error=failure.value.message if failure.check(GatewayError) else failure,
        )

    def _release(self, key: str, epoch: int) -> None:
        d = self._call("eval", RELEASE, [self._owner_key(key)], [f"{self.instance_id}|{epoch}"])
        d.addErrback(lambda _: None)  # Redis down: the key expires by itself

    def _on_evict(self, message: dict[str, Any]) -> None:
        account_id, trapos_id = message["key"]
        epoch = int(message["epoch"])
        session = self._registry.find(trapos_id, account_id)
        if session is None:
            return
        key = computer_key(account_id, trapos_id)
        owned = self._owned.get(key)
        if owned is not None and owned[0] is session:
            if owned[1] < epoch:
                self._replaced(session, owned[1], epoch)
        elif session in self._claiming:
            self._evicted[key] = max(epoch, self._evicted.get(key, 0))

    def _replaced(self, session: Session, ours: int, newer: int | None) -> None:
        """Another process holds the computer now: close our (older) connection."""
        key = computer_key(*session.key)
        if self._owned.get(key, (None,))[0] is session:
            del self._owned[key]
        log.info(
            "{traposId} connected again at another gateway (epoch {newer} > {ours}): "
            "closing its connection here",
            traposId=session.trapos_id,
            newer=newer if newer is not None else "?",
            ours=ours,
        )
        self._registry.remove(session)
        session.fail_all(GatewayError(wire.NOT_CONNECTED, "the computer connected again elsewhere"))
        session.link.close(wire.CLOSE_REPLACED, "replaced")

    def _refresh(self) -> Deferred | None:
        if not self.connected:
            return None
        for session in self._registry:
            key = computer_key(*session.key)
            if session not in self._claiming and self._owned.get(key, (None,))[0] is not session:
                self._claim(session)  # connected while Redis was away
        owned = [(key, session, epoch) for key, (session, epoch) in self._owned.items()]
        ds = []
        size = limits.CLUSTER_REFRESH_BATCH
        for start in range(0, len(owned), size):
            batch = owned[start : start + size]
            keys: list[str] = []
            args: list[Any] = [self.instance_id, self._owner_ttl_ms]
            for key, _, epoch in batch:
                keys += [self._owner_key(key), self._epoch_key(key)]
                args.append(epoch)
            ds.append(self._call("eval", REFRESH, keys, args).addCallback(self._refreshed, batch))
        d = DeferredList(ds, fireOnOneErrback=True, consumeErrors=True)
        d.addErrback(lambda failure: failure.value.subFailure)
        return d

    def _refreshed(self, results: list[int], batch: list[tuple[str, Session, int]]) -> None:
        for (key, session, epoch), still_ours in zip(batch, results, strict=True):
            if not still_ours and self._owned.get(key) == (session, epoch):
                self._replaced(session, epoch, None)

    # -- Presence ----------------------------------------------------------------------------

    def _heartbeat(self) -> Deferred | None:
        if not self.connected:
            self.instances = []
            return None
        beat = orjson.dumps(
            {"id": self.instance_id, "computers": len(self._registry), "version": __version__}
        )
        d = self._call(
            "eval",
            HEARTBEAT,
            [self._instances_key],
            [self.instance_id, beat, self._heartbeat_ttl_ms, self._heartbeat_prefix],
        )
        d.addCallbacks(self._beaten, self._not_beaten)
        return d

    def _beaten(self, beats: list[str]) -> None:
        self.instances = sorted((orjson.loads(beat) for beat in beats), key=lambda b: b["id"])

    def _not_beaten(self, failure: Failure) -> Failure:
        self.instances = []
        return failure

    @property
    def redis_ok(self) -> bool:
        return self.connected and self.subscribed

    @property
    def size(self) -> int:
        """Live gateway processes, this one included (1 while Redis is away)."""
        return len(self.instances) if self.redis_ok and self.instances else 1

    def health(self, local: int) -> dict[str, Any]:
        """``/health``'s cluster fields: every process's computers (as of its heartbeat)."""
        if not (self.redis_ok and self.instances):
            return {"computers": local, "gateways": 1, "redisOk": self.redis_ok}
        others = sum(
            int(beat.get("computers", 0))
            for beat in self.instances
            if beat.get("id") != self.instance_id
        )
        return {"computers": local + others, "gateways": len(self.instances), "redisOk": True}

    def computers(self, local: list[dict[str, Any]]) -> Deferred:
        """
        Fires with ``/computers``'s body: ours (``local``) and every other live
        process's, each entry with its ``gateway``; the processes that did not
        answer within ``CLUSTER_LIST_TIMEOUT`` are listed in ``unreachableGateways``.
        """
        for entry in local:
            entry["gateway"] = self.instance_id
        others = {beat["id"] for beat in self.instances} - {self.instance_id}
        if not others or not self.redis_ok:
            return succeed({"computers": local})
        listing_id = uuid.uuid4().hex
        listing = _Listing(Deferred(), set(others), list(local))
        self._listings[listing_id] = listing
        for instance in others:
            d = self._publish(instance, {"t": "list", "id": listing_id, "from": self.instance_id})
            d.addCallbacks(
                self._list_sent,
                self._list_unsent,
                (listing_id, instance),
                None,
                (listing_id, instance),
            )
        d = listing.deferred
        d.addTimeout(limits.CLUSTER_LIST_TIMEOUT, self._reactor)
        d.addErrback(_ignore_cancel)  # a process that did not answer in time
        d.addCallback(self._listed_all, listing_id)
        return d

    def _list_sent(self, receivers: int, listing_id: str, instance: str) -> None:
        if not receivers:
            self._list_unsent(None, listing_id, instance)

    def _list_unsent(self, _: object, listing_id: str, instance: str) -> None:
        listing = self._listings.get(listing_id)
        if listing is not None and instance in listing.waiting:
            # Left as waiting: reported unreachable.  Done when every other one is.
            listing.waiting.discard(instance)
            listing.computers.append({"unreachable": instance})
            self._list_check(listing)

    def _list_check(self, listing: _Listing) -> None:
        if not listing.waiting and not listing.deferred.called:
            listing.deferred.callback(None)

    def _listed_all(self, _: object, listing_id: str) -> dict[str, Any]:
        listing = self._listings.pop(listing_id)
        unreachable = sorted(
            listing.waiting | {e["unreachable"] for e in listing.computers if "unreachable" in e}
        )
        computers = [e for e in listing.computers if "unreachable" not in e]
        computers.sort(key=lambda e: (e.get("accountId", ""), e.get("traposId", "")))
        body: dict[str, Any] = {"computers": computers}
        if unreachable:
            body["unreachableGateways"] = unreachable
        return body

    def _on_list(self, message: dict[str, Any]) -> None:
        computers = [self._describe(session) for session in self._registry]
        for entry in computers:
            entry["gateway"] = self.instance_id
        reply = {"t": "listed", "id": message["id"], "from": self.instance_id}
        reply["computers"] = computers
        self._publish(str(message["from"]), reply).addErrback(lambda _: None)

    def _on_listed(self, message: dict[str, Any]) -> None:
        listing = self._listings.get(message["id"])
        sender = message.get("from")
        if listing is None or sender not in listing.waiting:
            return
        listing.waiting.discard(sender)
        listing.computers.extend(e for e in message.get("computers", ()) if type(e) is dict)
        self._list_check(listing)

    # -- Requests for computers held elsewhere (the registry asks) ---------------------------

    def request(
        self,
        account_id: str,
        trapos_id: str,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
    ) -> Deferred:
        if not self.subscribed:
            # No answer could reach us.
            return fail(GatewayError(wire.UNAVAILABLE, "the gateway is not connected to Redis"))
        key = computer_key(account_id, trapos_id)
        d = self._call("get", self._owner_key(key))
        d.addCallback(self._relay, account_id, trapos_id, type, payload, timeout, on_partial)
        return d

    def _relay(
        self,
        owner: str | None,
        account_id: str,
        trapos_id: str,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
    ) -> Deferred:
        instance, _, epoch = (owner or "").rpartition("|")
        if not instance or instance == self.instance_id:
            raise GatewayError(wire.NOT_CONNECTED, f"{trapos_id} is not connected")
        relay_id = uuid.uuid4().hex
        d = Deferred(lambda _: self._relay_cancelled(relay_id))
        self._relays[relay_id] = _Relay(d, trapos_id, instance, on_partial)
        d.addTimeout(timeout + limits.CLUSTER_RELAY_MARGIN, self._reactor, _relay_timed_out)
        d.addBoth(self._relay_done, relay_id)
        message = {
            "t": "req",
            "id": relay_id,
            "from": self.instance_id,
            "key": [account_id, trapos_id],
            "epoch": epoch,
            "type": type,
            "payload": payload,
            "timeout": timeout,
        }
        sent = self._publish(instance, message)
        sent.addCallbacks(self._relay_sent, self._relay_unsent, (relay_id,), None, (relay_id,))
        return d

    def _relay_sent(self, receivers: int, relay_id: str) -> None:
        relay = self._relays.get(relay_id)
        if relay is not None and not receivers:
            relay.deferred.errback(
                GatewayError(
                    wire.UNAVAILABLE,
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
            message = {"t": "cancel", "id": relay_id, "from": self.instance_id}
            self._publish(relay.instance, message).addErrback(lambda _: None)

    def _relay_done(self, result: object, relay_id: str) -> object:
        self._relays.pop(relay_id, None)
        return result

    def _on_partial(self, message: dict[str, Any]) -> None:
        relay = self._relays.get(message["id"])
        payload = message.get("payload")
        if relay is not None and relay.on_partial is not None and type(payload) is dict:
            try:
                relay.on_partial(payload)
            except Exception:
                log.failure("a listener of relayed output failed")

    def _on_answer(self, message: dict[str, Any]) -> None:
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
                wire.Error(str(error.get("code")), str(error.get("message")))
                if type(error) is dict
                else None,
            )
        )

    # -- Requests from other processes for computers held here -------------------------------

    def _on_request(self, message: dict[str, Any]) -> None:
        sender, relay_id = str(message["from"]), str(message["id"])
        account_id, trapos_id = message["key"]
        session = self._registry.find(trapos_id, account_id)
        owned = self._owned.get(computer_key(account_id, trapos_id))
        timeout = message.get("timeout")
        if (
            session is None
            or owned is None
            or owned[0] is not session
            or str(owned[1]) != str(message.get("epoch"))
        ):
            self._answer(
                sender, relay_id, GatewayError(wire.NOT_CONNECTED, f"{trapos_id} is not connected")
            )
            return
        if type(timeout) not in (int, float) or not 0 < timeout <= limits.MAX_REQUEST_TIMEOUT:
            self._answer(sender, relay_id, GatewayError(wire.BAD_REQUEST, "bad relayed timeout"))
            return
        payload = message.get("payload")

        def partial(answer: dict[str, Any]) -> None:
            part = {"t": "partial", "id": relay_id, "payload": answer}
            self._publish(sender, part).addErrback(lambda _: None)

        d = self._registry.request(
            trapos_id,
            str(message.get("type")),
            payload if type(payload) is dict else {},
            timeout,
            account_id=account_id,
            on_partial=partial,
        )
        self._serving[(sender, relay_id)] = d
        d.addBoth(self._served, sender, relay_id)

    def _served(self, result: object, sender: str, relay_id: str) -> None:
        self._serving.pop((sender, relay_id), None)
        if isinstance(result, Failure):
            if result.check(CancelledError):
                return None  # the requester cancelled: nobody waits
            if result.check(GatewayError):
                self._answer(sender, relay_id, result.value)
            else:
                log.failure("a relayed request failed", result)
                self._answer(sender, relay_id, GatewayError(wire.INTERNAL, "the gateway failed"))
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
        self._publish(sender, answer).addErrback(lambda _: None)
        return None

    def _answer(self, sender: str, relay_id: str, error: GatewayError) -> None:
        message = {"t": "fail", "id": relay_id, "code": error.code, "message": error.message}
        self._publish(sender, message).addErrback(lambda _: None)

    def _on_cancel(self, message: dict[str, Any]) -> None:
        d = self._serving.pop((str(message["from"]), str(message["id"])), None)
        if d is not None:
            d.cancel()

    _handlers: dict[str, Callable[[Cluster, dict[str, Any]], None]] = {
        "evict": _on_evict,
        "req": _on_request,
        "cancel": _on_cancel,
        "partial": _on_partial,
        "res": _on_answer,
        "fail": _on_answer,
        "list": _on_list,
        "listed": _on_listed,
    }
