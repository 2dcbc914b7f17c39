"""
Cluster mode (SPEC §13): several gateway processes, behind any load balancer,
act as one by sharing presence and routing requests through Redis.

Imported only when ``SANDBOX_REDIS_URL`` is set.  ``Cluster`` is this process
as a member: it composes the parts below, runs the heartbeat and refresh
loops, and hands each message in its inbox to the part that owns it:

    redis       the two connections (commands, inbox), every call bounded
    ownership   who holds which computer, with fencing epochs   {t: evict}
    presence    the live processes, /health and /computers      {t: list, listed}
    relay       requests to and from other processes            {t: req, cancel,
                                                                 partial, res, fail}

Every change to Redis is one Lua script, so no two processes interleave.
Inbox messages are JSON objects; pub/sub is fire-and-forget, so none carries
state that a lost message would leave wrong (the refresh heals a lost
eviction).

Redis down: computers connected here keep working (nothing on their path
waits for Redis), requests for computers elsewhere fail with
``unavailable`` (503) at once or within ``CLUSTER_CALL_TIMEOUT``, those
relayed already too (``Relay.lost``), and both connections come back by
themselves; the refresh then writes this process's ownerships again.  For a
while after (``rebuild_window``) the others may not have written theirs yet:
a computer nobody holds is looked up again meanwhile (``Ownership.holder``)
rather than answered 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from trapsandbox import limits
from trapsandbox.cluster.loops import never_fails, start_loop
from trapsandbox.cluster.ownership import Ownership
from trapsandbox.cluster.presence import Presence
from trapsandbox.cluster.redis import Redis, RedisAddress, inbox_of
from trapsandbox.cluster.relay import Relay
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import PartialListener, Session

log = Logger()


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
        self._reactor = reactor
        self.instance_id = instance_id or uuid.uuid4().hex[:16]
        self.refresh_interval = refresh_interval
        self.heartbeat_interval = min(limits.CLUSTER_HEARTBEAT_INTERVAL, refresh_interval)
        # Redis came back: every other process rewrites its ownerships once it has
        # reconnected (each backs off to CLUSTER_RECONNECT_MAX_DELAY) and refreshed (each
        # refresh interval, or at once), every call within call_timeout.
        self.rebuild_window = refresh_interval + limits.CLUSTER_RECONNECT_MAX_DELAY + call_timeout
        self._outage = False
        self.redis = Redis(
            RedisAddress.from_url(url),
            reactor,
            call_timeout,
            inbox_of(self.instance_id),
            self._inbox_message,
            self._subscribed,
            self._lost,
        )
        self.ownership = Ownership(
            registry,
            self.redis,
            self.instance_id,
            int(refresh_interval * limits.CLUSTER_OWNER_TTL_FACTOR * 1000),
            reactor,
        )
        self.presence = Presence(
            registry,
            self.redis,
            self.instance_id,
            describe,
            int(self.heartbeat_interval * limits.CLUSTER_HEARTBEAT_TTL_FACTOR * 1000),
            reactor,
            list_interval=refresh_interval,
        )
        self.relay = Relay(registry, self.redis, self.ownership, self.instance_id, reactor)
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "evict": self.ownership.on_evict,
            "req": self.relay.on_request,
            "cancel": self.relay.on_cancel,
            "partial": self.relay.on_partial,
            "res": self.relay.on_answer,
            "fail": self.relay.on_answer,
            "list": self.presence.on_list,
            "listed": self.presence.on_listed,
        }
        self._loops: list[task.LoopingCall] = []

    # -- The registry's peers ----------------------------------------------------------------

    def added(self, session: Session) -> None:
        self.ownership.added(session)

    def removed(self, session: Session) -> None:
        self.ownership.removed(session)

    def claim_answered(self, session: Session) -> Deferred[None] | None:
        return self.ownership.claim_answered(session)

    def request(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
    ) -> Deferred:
        return self.relay.request(caller, type, payload, timeout, on_partial)

    def holds(self, account_id: str, trapos_id: str) -> Deferred[bool]:
        d = self.ownership.holder(account_id, trapos_id, within=limits.CLUSTER_CALL_TIMEOUT)
        d.addCallback(lambda holder: holder[0] not in ("", self.instance_id))
        return d

    # -- What the HTTP surface and the metrics read ------------------------------------------

    @property
    def redis_ok(self) -> bool:
        return self.redis.ok

    @property
    def size(self) -> int:
        return self.presence.size

    def health(self, local: int) -> dict[str, Any]:
        return self.presence.health(local)

    def computers(self, local: list[dict[str, Any]]) -> Deferred:
        return self.presence.computers(local)

    # -- What the /operator socket's watches read ---------------------------------------------

    def watch_computers(self, listener: Callable[[], None]) -> Callable[[], None]:
        """``listener`` after each change to ``elsewhere`` (``Presence.watch``)."""
        return self.presence.watch(listener)

    @property
    def elsewhere(self) -> dict[str, Any]:
        """The other processes' computers while watched (``Presence.elsewhere``)."""
        return self.presence.elsewhere

    def watch_activity(self, caller: Caller, listener: PartialListener) -> Deferred:
        """The activity of a computer another process holds (``Relay.watch_activity``)."""
        return self.relay.watch_activity(caller, listener)

    # -- Starting and stopping ---------------------------------------------------------------

    def start(self) -> None:
        connected = self.redis.start()
        for what, interval in (
            (self.heartbeat, self.heartbeat_interval),
            (self.ownership.refresh, self.refresh_interval),
        ):
            self._loops.append(start_loop(what, interval, self._reactor, now=False))
        # The first heartbeat as soon as Redis answers, not one interval later.
        connected.addCallback(lambda _: never_fails(self.heartbeat))
        address = self.redis.address
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
        self.relay.stop()
        d = self.presence.leave()
        d.addErrback(lambda _: None)
        d.addCallback(lambda _: self.redis.disconnect())
        return d

    def heartbeat(self) -> Deferred | None:
        """``Presence.heartbeat``; relays to a process it no longer lists are given up."""
        mark, at = self.relay.mark, self._reactor.seconds()
        ttl = self.heartbeat_interval * limits.CLUSTER_HEARTBEAT_TTL_FACTOR
        d = self.presence.heartbeat()
        if d is not None:
            d.addCallback(lambda _: self.relay.live(self.presence.live, mark, at, ttl))
            d.addCallback(lambda _: self.relay.cancel_owed())
        return d

    def _subscribed(self) -> None:
        # Back after an outage: write the heartbeat and our ownerships now, and give the
        # others the time to write theirs.
        if self._outage:
            self._outage = False
            self.ownership.rebuilding(self.rebuild_window)
        never_fails(self.heartbeat)
        never_fails(self.ownership.refresh)
        self.relay.cancel_owed()

    def _lost(self) -> None:
        self._outage = True
        self.relay.lost()

    # -- The inbox ---------------------------------------------------------------------------

    def _inbox_message(self, message: str | bytes) -> None:
        try:
            obj = orjson.loads(message)
            handler = self._handlers.get(obj.get("t")) if type(obj) is dict else None
            if handler is None:
                log.warn("cluster: ignored an inbox message that is not ours")
                return
            handler(obj)
        except Exception:
            log.failure("cluster: an inbox message failed")
