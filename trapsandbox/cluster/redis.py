"""
The connection to Redis (SPEC §13): one connection for commands, every call
bounded and refused at once while Redis is away, and one subscribed to this
process's inbox channel.  Both reconnect by themselves, and the inbox
subscribes again on every new connection.

Built from txredisapi's public factories (``RedisFactory``,
``SubscriberFactory``), so this module reads the pool's size from the factory
it made rather than from inside a ``lazyConnectionPool`` handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import orjson
import txredisapi
from hyperlink import URL
from twisted.internet import endpoints
from twisted.internet.defer import CancelledError, Deferred, DeferredList, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError

log = Logger()


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


def inbox_of(instance: str) -> str:
    """The pub/sub channel a process listens on: ``inbox:<id>``."""
    return f"{limits.CLUSTER_PREFIX}inbox:{instance}"


class _InboxProtocol(txredisapi.SubscriberProtocol):
    factory: _InboxFactory

    def connectionMade(self):
        d = super().connectionMade()
        # Every (re)connection subscribes again: a new connection has no channels.
        self.whenConnected().addCallback(self.factory.on_connected)
        return d

    def messageReceived(self, pattern, channel, message) -> None:
        self.factory.on_message(message)

    def connectionLost(self, why) -> None:
        self.factory.on_lost()
        super().connectionLost(why)


class _InboxFactory(txredisapi.SubscriberFactory):
    protocol = _InboxProtocol

    def __init__(
        self,
        on_connected: Callable[[_InboxProtocol], None],
        on_message: Callable[[str | bytes], None],
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__(isLazy=True)
        self.on_connected = on_connected
        self.on_message = on_message
        self.on_lost = on_lost


def reconnecting(factory: Any) -> None:
    """txredisapi backs off to 10 s by default; Redis restarting is short."""
    factory.initialDelay = limits.CLUSTER_RECONNECT_INITIAL_DELAY
    factory.maxDelay = limits.CLUSTER_RECONNECT_MAX_DELAY


def command_connection(
    address: RedisAddress, reactor: Any, timeout: float, charset: str | None = "utf-8"
) -> txredisapi.RedisFactory:
    """
    The one way the gateway opens Redis for commands (the cluster's, the snapshot store's):
    txredisapi's public factory, one lazy connection that reconnects by itself, every reply
    bounded by ``timeout``; its ``deferred`` fires once it is first up. ``charset=None``:
    values stay bytes.
    """
    factory = txredisapi.RedisFactory(
        f"{address.host}:{address.port}",
        address.db,
        1,
        isLazy=True,
        charset=charset,
        password=address.password,
        replyTimeout=timeout,
        convertNumbers=False,
    )
    reconnecting(factory)
    factory.startConnecting(
        endpoints.HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)
    )
    return factory


class Redis:
    """
    This process's two connections to Redis.  ``on_message`` is called with
    each message on ``inbox``; ``on_subscribed`` each time the inbox is
    subscribed again (at start, and after every outage); ``on_lost`` each time
    the inbox's connection is lost (nothing sent to us arrives until it is back).
    """

    def __init__(
        self,
        address: RedisAddress,
        reactor: Any,
        timeout: float,
        inbox: str,
        on_message: Callable[[str | bytes], None],
        on_subscribed: Callable[[], None],
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.inbox = inbox
        self._reactor = reactor
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._on_lost = on_lost
        self.subscribed = False
        self._commands: txredisapi.RedisFactory | None = None
        self._inbox: _InboxFactory | None = None

    def start(self) -> Deferred:
        """Start connecting both; fires once the commands connection is first up."""
        address = self.address
        commands = command_connection(address, self._reactor, self.timeout)
        inbox = _InboxFactory(self._inbox_connected, self._on_message, self._inbox_lost)
        inbox.password = address.password
        reconnecting(inbox)
        inbox.startConnecting(
            endpoints.HostnameEndpoint(
                self._reactor, address.host, address.port, timeout=self.timeout
            )
        )
        self._commands, self._inbox = commands, inbox
        return commands.deferred

    def disconnect(self) -> Deferred:
        """Close both connections, within ``timeout``; never fails."""
        ds = [factory.disconnect() for factory in (self._commands, self._inbox) if factory]
        d = DeferredList(ds, consumeErrors=True)
        d.addTimeout(self.timeout, self._reactor)
        d.addErrback(lambda _: None)
        return d

    # -- Commands: every one bounded ---------------------------------------------------------

    @property
    def connected(self) -> bool:
        # txredisapi would queue a command until Redis is back: refuse at once instead.
        return self._commands is not None and self._commands.size > 0

    @property
    def ok(self) -> bool:
        """Both ways work: commands go out and the inbox hears answers."""
        return self.connected and self.subscribed

    def call(self, method: str, *args: Any) -> Deferred:
        """
        Run one txredisapi command; fails with ``GatewayError(unavailable)``
        at once while Redis is away, or when it does not answer in time.
        """
        if not self.connected:
            return fail(GatewayError(errors.UNAVAILABLE, "the gateway is not connected to Redis"))
        try:
            d = getattr(self._commands.handler, method)(*args)
        except Exception:
            return fail(GatewayError(errors.UNAVAILABLE, "the gateway cannot reach Redis"))
        d.addTimeout(self.timeout, self._reactor)
        d.addErrback(self._failed)
        return d

    def _failed(self, failure: Failure) -> Failure:
        if failure.check(GatewayError):
            return failure
        if failure.check(CancelledError):
            message = f"Redis did not answer within {self.timeout:g} s"
        else:
            message = f"Redis failed: {failure.getErrorMessage()}"
        return Failure(GatewayError(errors.UNAVAILABLE, message))

    def publish(self, instance: str, message: dict[str, Any]) -> Deferred:
        """Send to a process's inbox; fires with the number of receivers (0: it is gone)."""
        return self.call("publish", inbox_of(instance), orjson.dumps(message))

    # -- The inbox ---------------------------------------------------------------------------

    def _inbox_connected(self, protocol: _InboxProtocol) -> None:
        d = protocol.subscribe(self.inbox)
        d.addTimeout(self.timeout, self._reactor)
        d.addCallbacks(self._subscribed, self._subscribe_failed, errbackArgs=(protocol,))

    def _subscribed(self, _: object) -> None:
        self.subscribed = True
        log.info("cluster: listening on {inbox}", inbox=self.inbox)
        self._on_subscribed()

    def _subscribe_failed(self, failure: Failure, protocol: _InboxProtocol) -> None:
        log.warn("cluster: cannot subscribe to our inbox: {error}", error=failure.getErrorMessage())
        protocol.transport.abortConnection()  # reconnects, and tries again

    def _inbox_lost(self) -> None:
        self.subscribed = False
        self._on_lost()
