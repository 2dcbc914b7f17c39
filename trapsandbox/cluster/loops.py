"""The cluster's periodic work (heartbeat, ownership refresh, the console's listing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox.errors import GatewayError

log = Logger()


def never_fails(what: Callable[[], Deferred | None]) -> Deferred:
    """
    ``what()``, its failure (raised or in its Deferred) logged and not passed on: a
    LoopingCall stops for good at its first failure.
    """
    try:
        d = what()
    except Exception:
        log.failure("cluster: {what} failed", what=what.__name__)
        return succeed(None)
    if d is None:
        return succeed(None)
    d.addErrback(_failed, what.__name__)
    return d


def _failed(failure: Failure, what: str) -> None:
    if failure.check(GatewayError):
        log.warn("cluster: {what}: {message}", what=what, message=failure.value.message)
    else:
        log.failure("cluster: {what} failed", failure, what=what)


def start_loop(
    what: Callable[[], Deferred | None], interval: float, clock: Any, now: bool
) -> task.LoopingCall:
    """``what`` every ``interval`` seconds on ``clock``, whatever it raises."""
    loop = task.LoopingCall(never_fails, what)
    loop.clock = clock
    loop.start(interval, now=now)
    return loop
