"""
Changes of one computer's files that cannot mix (issue 43): a write, a move or a folder's
making holds its canonical paths (``computers.paths``) while it runs, and a change of any
path that overlaps them (the same path, one inside the other) waits for it, in the order
they came, so two saves of one file are one after the other, never interleaved part by
part, and a move never copies a file that a write is half-way through.

A change waits at most ``wait`` seconds (the injected clock's), and at most
``max_waiters`` changes wait for one computer at once; past either it is refused with
``overloaded``, saying which path is busy.  Changes of paths that do not overlap run side
by side.  These locks are the gateway's own: the computer keeps each write in a temporary
file of its own too (``writeId``, docs/protocol.md), so writers that another process sent
(cluster mode) or a player's program still never share one.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime

from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.computers.paths import ROOT, inside
from trapsandbox.errors import GatewayError

Computer = tuple[str, str]  # (accountId, traposId)
# What ``_overlap`` compares of a change's paths: each lowered, and each folder holding one
# (the path too); None when one has a non-ASCII character (then ``inside``, pair by pair).
Shape = tuple[frozenset[str], frozenset[str]] | None


def _shape(paths: tuple[str, ...]) -> Shape:
    if not all(path.isascii() for path in paths):
        return None
    lowered = frozenset(path.lower() for path in paths)
    around: set[str] = set()
    for path in lowered:
        while path not in around:
            around.add(path)
            path = path.rpartition("/")[0] or ROOT
    return lowered, frozenset(around)


def _overlap(a: Held, b: Held) -> bool:
    """Whether a path of ``a`` is ``inside`` one of ``b`` or holds one: a restore's batches
    of many files each are compared by sets, not pair by pair."""
    if a.shape is not None and b.shape is not None:
        (a_paths, a_around), (b_paths, b_around) = a.shape, b.shape
        return not a_paths.isdisjoint(b_around) or not b_paths.isdisjoint(a_around)
    return any(inside(x, y) or inside(y, x) for x in a.paths for y in b.paths)


@attrs.define(eq=False)
class Held:
    """Paths held for one change; ``release`` (once or more) lets the next change go."""

    computer: Computer
    paths: tuple[str, ...]
    _locks: PathLocks = attrs.field(repr=False)
    deferred: Deferred = attrs.field(factory=Deferred, repr=False)
    granted: bool = False
    timer: object = attrs.field(default=None, repr=False)
    shape: Shape = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.shape = _shape(self.paths)

    def release(self) -> None:
        self._locks._drop(self)


@attrs.define
class PathLocks:
    clock: IReactorTime
    wait: float = limits.PATH_LOCK_WAIT
    max_waiters: int = limits.PATH_LOCK_WAITERS
    # Per computer: the changes holding or waiting for paths, in the order they came.
    _queues: dict[Computer, list[Held]] = attrs.field(factory=dict, init=False)

    def acquire(self, computer: Computer, paths: Iterable[str]) -> Deferred[Held]:
        """
        Fires with a ``Held`` once no earlier change of ``computer`` overlaps ``paths``
        (canonical); fails with ``overloaded`` after ``wait`` seconds or at once when too
        many wait.  Cancelling it gives up the place in the queue.
        """
        queue = self._queues.setdefault(computer, [])
        held = Held(computer, tuple(paths), self)
        held.deferred = Deferred(lambda _: self._drop(held))
        if self._blocked(queue, len(queue), held):
            waiting = sum(1 for each in queue if not each.granted)
            if waiting >= self.max_waiters:
                return self._refused(computer, held.paths, f"{waiting} changes already wait")
            held.timer = self.clock.callLater(self.wait, self._timed_out, held)
            queue.append(held)
            return held.deferred
        queue.append(held)
        held.granted = True
        held.deferred.callback(held)
        return held.deferred

    def busy(self, computer: Computer) -> int:
        """Changes holding or waiting for paths of ``computer`` (for tests and metrics)."""
        return len(self._queues.get(computer, ()))

    @staticmethod
    def _blocked(queue: list[Held], before: int, held: Held) -> bool:
        return any(_overlap(queue[n], held) for n in range(before))

    def _refused(self, computer: Computer, paths: tuple[str, ...], why: str) -> Deferred:
        shown = ", ".join(wire.cut(p) for p in paths)
        return fail(
            GatewayError(
                errors.OVERLOADED,
                f"another change of {shown} on {wire.cut(computer[1])} is under way and "
                f"{why}: try again when it is done",
            )
        )

    def _timed_out(self, held: Held) -> None:
        held.timer = None
        self._remove(held)
        shown = ", ".join(wire.cut(p) for p in held.paths)
        held.deferred.errback(
            GatewayError(
                errors.OVERLOADED,
                f"another change of {shown} on {wire.cut(held.computer[1])} was still under "
                f"way after {self.wait:g} s: try again when it is done",
            )
        )

    def _drop(self, held: Held) -> None:
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None
        self._remove(held)

    def _remove(self, held: Held) -> None:
        queue = self._queues.get(held.computer)
        if queue is None or held not in queue:
            return
        queue.remove(held)
        if not queue:
            del self._queues[held.computer]
            return
        granted = []
        for n, each in enumerate(queue):
            if not each.granted and not self._blocked(queue, n, each):
                each.granted = True
                granted.append(each)
        for each in granted:  # (after the scan: a callback may change the queue)
            if each.timer is not None:
                each.timer.cancel()
                each.timer = None
            each.deferred.callback(each)
