"""
Which gateway processes are alive, and what the whole cluster holds (SPEC
§13): this process's heartbeat, the live processes it returns, ``/health``'s
cluster fields and ``/computers``' cluster-wide listing.

Redis holds:

    instances          the set of process ids (the heartbeat prunes dead ones)
    instance:<id>      a process's heartbeat {id, computers, version}, with a TTL

A listing asks every other live process through its inbox and waits at most
``CLUSTER_LIST_TIMEOUT``:

    {t: list, id, from}   ->   {t: listed, id, from, computers}

While someone watches the computers (``watch``: an ``/operator``
``watch_computers``), the other processes are listed again every
``list_interval`` (the refresh interval), and never while nobody does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import orjson
from twisted.internet import task
from twisted.internet.defer import CancelledError, Deferred, TimeoutError, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import __version__, limits
from trapsandbox.cluster.loops import start_loop
from trapsandbox.cluster.redis import Redis
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session, listing_key

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

log = Logger()

_INSTANCES = limits.CLUSTER_PREFIX + "instances"
_HEARTBEAT_PREFIX = limits.CLUSTER_PREFIX + "instance:"


def _ignore_cancel(failure: Failure) -> None:
    # (``addTimeout`` turns its cancel into a TimeoutError.)
    failure.trap(CancelledError, TimeoutError)


@attrs.define(eq=False)
class _Listing:
    deferred: Deferred
    waiting: set[str]
    computers: list[dict[str, Any]] = attrs.field(factory=list)


class Presence:
    """
    This process among the live ones.  ``describe`` turns a session into its
    ``/computers`` entry.
    """

    def __init__(
        self,
        registry: Registry,
        redis: Redis,
        instance_id: str,
        describe: Callable[[Session], dict[str, Any]],
        ttl_ms: int,
        reactor: Any,
        list_interval: float = limits.CLUSTER_REFRESH_INTERVAL,
    ) -> None:
        self._registry = registry
        self._redis = redis
        self._instance_id = instance_id
        self._describe = describe
        self._ttl_ms = ttl_ms
        self._reactor = reactor
        self._listings: dict[str, _Listing] = {}
        # The live processes, from the last heartbeat (empty while Redis is down).
        self.instances: list[dict[str, Any]] = []
        self._list_interval = list_interval
        self._watchers: list[Callable[[], None]] = []
        self._relisting: task.LoopingCall | None = None
        # While watched: the other processes' computers, as ``computers([])`` answers them
        # (with ``unreachableGateways``), as of the last listing (``_relist``).
        self.elsewhere: dict[str, Any] = {"computers": []}

    # -- The heartbeat -----------------------------------------------------------------------

    def heartbeat(self) -> Deferred | None:
        """Say this process is alive (with its computer count) and learn who else is."""
        if not self._redis.connected:
            self.instances = []
            return None
        beat = orjson.dumps(
            {"id": self._instance_id, "computers": len(self._registry), "version": __version__}
        )
        d = self._redis.call(
            "eval",
            HEARTBEAT,
            [_INSTANCES],
            [self._instance_id, beat, self._ttl_ms, _HEARTBEAT_PREFIX],
        )
        d.addCallbacks(self._beaten, self._not_beaten)
        return d

    @property
    def live(self) -> set[str]:
        """The ids of the live processes, as of the last heartbeat."""
        return {beat["id"] for beat in self.instances}

    def _beaten(self, beats: list[str]) -> None:
        self.instances = sorted((orjson.loads(beat) for beat in beats), key=lambda b: b["id"])

    def _not_beaten(self, failure: Failure) -> Failure:
        self.instances = []
        return failure

    def leave(self) -> Deferred:
        """Leave the live set at once (a clean stop) rather than when the heartbeat expires."""
        return self._redis.call(
            "eval",
            LEAVE,
            [_INSTANCES, _HEARTBEAT_PREFIX + self._instance_id],
            [self._instance_id],
        )

    # -- /health and the metrics -------------------------------------------------------------

    @property
    def size(self) -> int:
        """Live gateway processes, this one included (1 while Redis is away)."""
        return len(self.instances) if self._redis.ok and self.instances else 1

    def health(self, local: int) -> dict[str, Any]:
        """``/health``'s cluster fields: every process's computers (as of its heartbeat)."""
        if not (self._redis.ok and self.instances):
            return {"computers": local, "gateways": 1, "redisOk": self._redis.ok}
        others = sum(
            int(beat.get("computers", 0))
            for beat in self.instances
            if beat.get("id") != self._instance_id
        )
        return {"computers": local + others, "gateways": len(self.instances), "redisOk": True}

    # -- /computers --------------------------------------------------------------------------

    def computers(self, local: list[dict[str, Any]]) -> Deferred:
        """
        Fires with ``/computers``'s body: ours (``local``) and every other live
        process's, each entry with its ``gateway``; the processes that did not
        answer within ``CLUSTER_LIST_TIMEOUT`` are listed in ``unreachableGateways``.
        """
        for entry in local:
            entry["gateway"] = self._instance_id
        others = {beat["id"] for beat in self.instances} - {self._instance_id}
        if not others or not self._redis.ok:
            return succeed({"computers": local})
        listing_id = uuid.uuid4().hex
        listing = _Listing(Deferred(), set(others), list(local))
        self._listings[listing_id] = listing
        for instance in others:
            message = {"t": "list", "id": listing_id, "from": self._instance_id}
            d = self._redis.publish(instance, message)
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
        computers.sort(key=listing_key)
        body: dict[str, Any] = {"computers": computers}
        if unreachable:
            body["unreachableGateways"] = unreachable
        return body

    def on_list(self, message: dict[str, Any]) -> None:
        """``{t: list}``: another process lists the cluster; answer with ours."""
        computers = [self._describe(session) for session in self._registry]
        for entry in computers:
            entry["gateway"] = self._instance_id
        reply = {"t": "listed", "id": message["id"], "from": self._instance_id}
        reply["computers"] = computers
        self._redis.publish(str(message["from"]), reply).addErrback(lambda _: None)

    def on_listed(self, message: dict[str, Any]) -> None:
        """``{t: listed}``: one process's part of a listing of ours."""
        listing = self._listings.get(message["id"])
        sender = message.get("from")
        if listing is None or sender not in listing.waiting:
            return
        listing.waiting.discard(sender)
        listing.computers.extend(e for e in message.get("computers", ()) if type(e) is dict)
        self._list_check(listing)

    # -- The other processes' computers, live (``watch``) --------------------------------------

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """
        Call ``listener`` after each change to ``elsewhere``, which is kept
        up to date (listed again every ``list_interval``) while at least one
        listener is; answers the function that stops it.
        """
        self._watchers.append(listener)
        if self._relisting is None:
            self._relisting = start_loop(self._relist, self._list_interval, self._reactor, now=True)

        def stop() -> None:
            if listener in self._watchers:
                self._watchers.remove(listener)
            if not self._watchers and self._relisting is not None:
                loop, self._relisting = self._relisting, None
                if loop.running:
                    loop.stop()
                self.elsewhere = {"computers": []}  # not kept up to date any more

        return stop

    def _relist(self) -> Deferred | None:
        if not self._redis.ok:
            self._unknown()
            return None
        d = self.computers([])
        d.addCallback(self._relisted)
        d.addErrback(self._relist_failed)
        return d

    def _relist_failed(self, failure: Failure) -> Failure:
        self._unknown()
        return failure  # logged by never_fails

    def _unknown(self) -> None:
        """Redis is away: what the others hold is unknown, so each is said unreachable."""
        kept = self.elsewhere["computers"]
        self._relisted({"computers": [], "unreachableGateways": [e["gateway"] for e in kept]})

    def _relisted(self, body: dict[str, Any]) -> None:
        """
        ``body`` is what ``computers([])`` answered.  A process that did not
        answer keeps its computers as last listed, said unreachable: they
        are neither shown gone nor claimed reachable.
        """
        if not self._watchers:
            return  # the last watcher left while this listing went
        unreachable = set(body.get("unreachableGateways", ()))
        fresh = {listing_key(e) for e in body["computers"]}
        kept = [
            e
            for e in self.elsewhere["computers"]
            if e.get("gateway") in unreachable and listing_key(e) not in fresh  # (moved since)
        ]
        computers = sorted([*body["computers"], *kept], key=listing_key)
        elsewhere: dict[str, Any] = {"computers": computers}
        if unreachable:
            elsewhere["unreachableGateways"] = sorted(unreachable)
        if elsewhere == self.elsewhere:
            return
        self.elsewhere = elsewhere
        for listener in list(self._watchers):
            try:
                listener()
            except Exception:
                log.failure("a watcher of the cluster's computers failed")
