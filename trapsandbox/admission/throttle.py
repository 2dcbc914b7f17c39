"""
Slowing down wrong secrets and tokens, per client address.

An address may fail a few times freely; after that each failure blocks it
for a growing period (doubling, capped), and its wrong attempts are refused
until the block ends (they are not counted again meanwhile), while other
addresses are not affected.  Only failures come here: ``auth.Admission``
checks a credential first and admits a right one whatever its address's
record (SPEC §4), so a stranger's guesses never lock out the computers or
the operator sharing that address.

What this protects, then: it tells a misconfigured client to back off
(4003 and ``Retry-After`` are temporary; the Lua client waits), it bounds
the warnings (one per address and period) and the table (bounded, quiet
addresses forgotten).  It does not stop guessing: a refusal tells the
guesser nothing, but a right guess is admitted even while blocked, so the
secret's strength is what stops it.  A success does not clear the record:
computers behind one address (a Minecraft server) would otherwise reset a
guesser's count there.
"""

from __future__ import annotations

import attrs
from twisted.internet.interfaces import IReactorTime

from trapsandbox import limits


@attrs.define
class _Record:
    failures: int = 0
    blocked_until: float = 0.0
    last_failure: float = 0.0
    warned_until: float = 0.0


@attrs.define
class FailureThrottle:
    clock: IReactorTime
    free_failures: int = limits.FREE_FAILURES
    base_block: float = limits.BASE_BLOCK
    max_block: float = limits.MAX_BLOCK
    forget_after: float = limits.FORGET_AFTER
    max_addresses: int = limits.MAX_THROTTLED_ADDRESSES
    _records: dict[str, _Record] = attrs.field(factory=dict, init=False)

    def __len__(self) -> int:
        return len(self._records)

    def blocked_for(self, address: str) -> float:
        """Seconds ``address`` must still wait before it may try again (0: it may)."""
        record = self._records.get(address)
        if record is None:
            return 0.0
        now = self.clock.seconds()
        if now - record.last_failure > self.forget_after:
            del self._records[address]
            return 0.0
        return max(0.0, record.blocked_until - now)

    def failed(self, address: str) -> tuple[float, bool]:
        """
        Count a failure; returns how long ``address`` is now blocked, and
        whether this is the first failure worth a warning in this period.
        """
        now = self.clock.seconds()
        record = self._records.get(address)
        if record is None or now - record.last_failure > self.forget_after:
            if len(self._records) >= self.max_addresses:
                self._evict(now)
            record = self._records[address] = _Record()
        record.failures += 1
        record.last_failure = now
        over = record.failures - self.free_failures
        if over <= 0:
            return 0.0, False
        block = min(self.max_block, self.base_block * 2 ** min(over - 1, 32))
        record.blocked_until = now + block
        warn = now >= record.warned_until
        if warn:
            record.warned_until = now + self.max_block
        return block, warn

    def _evict(self, now: float) -> None:
        stale = [a for a, r in self._records.items() if now - r.last_failure > self.forget_after]
        for address in stale:
            del self._records[address]
        if len(self._records) >= self.max_addresses:
            # Still full: drop the address that failed longest ago.
            oldest = min(self._records, key=lambda a: self._records[a].last_failure)
            del self._records[oldest]
