"""
Which process holds which computer (SPEC §13), with fencing epochs.

On hello this process claims the computer: ``CLAIM`` increments its epoch
and records the owner; the previous owner, if another process, is told
through its inbox (``{t: evict, key, epoch}``) and closes its connection
(4000) only if its epoch is lower, so the newest hello wins.  Ownerships are
refreshed in batches; one that is gone (Redis restarted empty, or it
expired) is written again unless a newer hello took the counter past it, and
the counter is raised to at least our epoch, so fencing tokens never go
backwards.  Releasing is compare-and-delete.  Pub/sub is fire-and-forget:
the refresh heals a lost eviction.

After Redis comes back (``rebuilding``) every process writes its
ownerships again, each within a refresh of its own reconnecting: until
then a computer nobody holds in Redis may well be connected, so ``holder``
looks it up again rather than answer "nobody" (a 404) for it.

Redis holds, with ``<key>`` the JSON ``["accountId", "traposId"]``
(``computer_key``):

    epoch:<key>    the computer's epoch counter: each hello INCRs it
                   ("newest" is the hello Redis ran last)
    owner:<key>    "<instance>|<epoch>" with a TTL
"""

from __future__ import annotations

from typing import Any

import orjson
from twisted.internet import task
from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.cluster.redis import Redis
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError

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


def computer_key(account_id: str, trapos_id: str) -> str:
    return orjson.dumps([account_id, trapos_id]).decode()


def _owner_key(key: str) -> str:
    return f"{limits.CLUSTER_PREFIX}owner:{key}"


def _epoch_key(key: str) -> str:
    return f"{limits.CLUSTER_PREFIX}epoch:{key}"


def _answer(waiting: list[Deferred]) -> None:
    for d in waiting:
        d.callback(None)


def _holder(owner: str | None) -> tuple[str, str]:
    """An owner value's ``(instance, epoch)``; ``("", ...)`` when nobody holds it."""
    instance, _, epoch = (owner or "").rpartition("|")
    return instance, epoch


class Ownership:
    """The computers this process holds in Redis, and at which epoch."""

    def __init__(
        self, registry: Registry, redis: Redis, instance_id: str, ttl_ms: int, clock: Any
    ) -> None:
        self._registry = registry
        self._redis = redis
        self._instance_id = instance_id
        self._ttl_ms = ttl_ms
        self._clock = clock
        # Until when the cluster writes its ownerships again (``rebuilding``).
        self._rebuilt_at = 0.0
        # What this process holds: key -> (session, epoch).
        self._owned: dict[str, tuple[Session, int]] = {}
        # Claims out: key -> (the session claimed, who waits for Redis's answer).
        self._claiming: dict[str, tuple[Session, list[Deferred]]] = {}
        # Evictions that arrived before our own claim's answer: key -> epoch.
        self._evicted: dict[str, int] = {}

    def epoch_of(self, session: Session) -> int | None:
        """The epoch we hold ``session``'s computer at, if it is that session we hold."""
        owned = self._owned.get(computer_key(*session.key))
        return owned[1] if owned is not None and owned[0] is session else None

    def claim_answered(self, session: Session) -> Deferred[None] | None:
        """
        While our claim of ``session``'s computer is out, a Deferred that fires once
        Redis has answered it (``epoch_of`` then says whether we hold it); else None.

        Redis may have run our claim, and another process read it and sent us a
        request, before we have read Redis's answer: the two come on different
        connections.
        """
        claim = self._claiming.get(computer_key(*session.key))
        if claim is None or claim[0] is not session:
            return None
        d: Deferred[None] = Deferred()
        claim[1].append(d)
        return d

    def rebuilding(self, seconds: float) -> None:
        """
        Redis is back (maybe empty): for ``seconds`` the other processes may not have
        written their ownerships again yet.
        """
        self._rebuilt_at = max(self._rebuilt_at, self._clock.seconds() + seconds)

    def holder(self, account_id: str, trapos_id: str, within: float | None = None) -> Deferred:
        """
        Fires with the computer's ``(instance, epoch)`` in Redis (instance "": nobody).
        While the cluster rebuilds (``rebuilding``), nobody is looked up again every
        ``CLUSTER_REBUILD_POLL`` until somebody holds it or the rebuild is over (then
        nobody it is); a caller that cannot wait that long (``within`` seconds) gets
        ``unavailable`` then rather than a "nobody" that may be wrong.
        """
        deadline = None if within is None else self._clock.seconds() + within
        return self._look_up(computer_key(account_id, trapos_id), deadline)

    def _look_up(self, key: str, deadline: float | None) -> Deferred:
        d = self._redis.call("get", _owner_key(key))
        d.addCallback(_holder)
        d.addCallback(self._looked_up, key, deadline)
        return d

    def _looked_up(
        self, holder: tuple[str, str], key: str, deadline: float | None
    ) -> tuple[str, str] | Deferred:
        now = self._clock.seconds()
        if holder[0] or now >= self._rebuilt_at:
            return holder
        end = self._rebuilt_at if deadline is None else min(deadline, self._rebuilt_at)
        if now >= end:
            raise GatewayError(
                errors.UNAVAILABLE,
                "the gateways are writing again which of them holds which computer "
                "(Redis came back): try again in a few seconds",
            )
        wait = min(limits.CLUSTER_REBUILD_POLL, end - now)
        return task.deferLater(self._clock, wait, self._look_up, key, deadline)

    # -- The registry tells us ---------------------------------------------------------------

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
        older = self._claiming.get(key)
        self._claiming[key] = (session, [])
        if older is not None:
            # It replaces one here whose claim is still out: that one's waiters are answered
            # (its hello, then the registry closes it 4000, as in one process).
            _answer(older[1])
        d = self._redis.call(
            "eval",
            CLAIM,
            [_epoch_key(key), _owner_key(key)],
            [self._instance_id, self._ttl_ms],
        )
        d.addCallbacks(self._claimed, self._claim_failed, (session, key), None, (session, key))
        d.addErrback(lambda failure: log.failure("cluster: claiming a computer failed", failure))
        d.addBoth(self._claim_settled, session, key)

    def _claim_settled(self, _: None, session: Session, key: str) -> None:
        """The claim is answered (and its answer seen to): its waiters are told."""
        claim = self._claiming.get(key)
        if claim is not None and claim[0] is session:
            del self._claiming[key]
            _answer(claim[1])

    def _claimed(self, reply: list[Any], session: Session, key: str) -> None:
        epoch, previous = int(reply[0]), reply[1]
        evicted = self._evicted.pop(key, 0)
        if self._registry.find(session.account_id, session.trapos_id) is not session:
            self._release(key, epoch)  # it left (or was replaced) while we claimed it
            return
        if evicted > epoch:
            # Its hello is answered first, then it is closed: as when replaced later.
            self._claim_settled(None, session, key)
            self._replaced(session, epoch, evicted)
            return
        self._owned[key] = (session, epoch)
        if previous:
            instance, _ = _holder(previous)
            if instance != self._instance_id:
                message = {"t": "evict", "key": session.key, "epoch": epoch}
                d = self._redis.publish(instance, message)
                d.addErrback(lambda _: None)  # it is gone; or the refresh tells it

    def _claim_failed(self, failure: Failure, session: Session, key: str) -> None:
        self._evicted.pop(key, None)
        # The computer works here; the next refresh claims it once Redis answers.
        log.warn(
            "cluster: {traposId} is reachable only here for now: {error}",
            traposId=session.trapos_id,
            error=failure.value.message if failure.check(GatewayError) else failure,
        )

    def _release(self, key: str, epoch: int) -> None:
        d = self._redis.call("eval", RELEASE, [_owner_key(key)], [f"{self._instance_id}|{epoch}"])
        d.addErrback(lambda _: None)  # Redis down: the key expires by itself

    # -- A newer hello elsewhere -------------------------------------------------------------

    def on_evict(self, message: dict[str, Any]) -> None:
        """``{t: evict, key, epoch}``: another process claimed one of ours."""
        account_id, trapos_id = message["key"]
        epoch = int(message["epoch"])
        session = self._registry.find(account_id, trapos_id)
        if session is None:
            return
        key = computer_key(account_id, trapos_id)
        owned = self._owned.get(key)
        if owned is not None and owned[0] is session:
            if owned[1] < epoch:
                self._replaced(session, owned[1], epoch)
        elif self._claiming.get(key, (None,))[0] is session:
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
        session.fail_all(
            GatewayError(errors.NOT_CONNECTED, "the computer connected again elsewhere")
        )
        session.link.close(wire.CLOSE_REPLACED, "replaced")

    # -- The refresh -------------------------------------------------------------------------

    def refresh(self) -> Deferred | None:
        """
        Claim what connected while Redis was away, renew what we hold (in
        batches), and close what another process took meanwhile.
        """
        if not self._redis.connected:
            return None
        for session in self._registry:
            key = computer_key(*session.key)
            claiming = self._claiming.get(key, (None,))[0] is session
            if not claiming and self._owned.get(key, (None,))[0] is not session:
                self._claim(session)  # connected while Redis was away
        owned = [(key, session, epoch) for key, (session, epoch) in self._owned.items()]
        ds = []
        size = limits.CLUSTER_REFRESH_BATCH
        for start in range(0, len(owned), size):
            batch = owned[start : start + size]
            keys: list[str] = []
            args: list[Any] = [self._instance_id, self._ttl_ms]
            for key, _, epoch in batch:
                keys += [_owner_key(key), _epoch_key(key)]
                args.append(epoch)
            d = self._redis.call("eval", REFRESH, keys, args)
            ds.append(d.addCallback(self._refreshed, batch))
        d = DeferredList(ds, fireOnOneErrback=True, consumeErrors=True)
        d.addErrback(lambda failure: failure.value.subFailure)
        return d

    def _refreshed(self, results: list[int], batch: list[tuple[str, Session, int]]) -> None:
        for (key, session, epoch), still_ours in zip(batch, results, strict=True):
            if not still_ours and self._owned.get(key) == (session, epoch):
                self._replaced(session, epoch, None)
