"""
Which snapshots a prune drops (SPEC §15), as a pure function both stores call.

1. Per computer, all but the newest ``keep``.
2. Then across the account, oldest first, until the content the rest use (each hash
   counted once, as it is stored) is within ``quota``.  The account's newest snapshot
   always stays: the one just taken before an ask must survive its own prune.

What the dropped snapshots used and no kept one uses is then removed by the store, never
content a kept snapshot uses (the stores sweep only content nothing references).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import attrs


@attrs.frozen
class Held:
    """A stored snapshot as retention sees it: whose, how old, what content it uses."""

    trapos_id: str
    seq: int
    created: int
    content: Mapping[str, int]  # sha256 -> size


def used_bytes(held: Iterable[Held]) -> int:
    """The bytes of the content ``held`` uses, each hash once."""
    sizes: dict[str, int] = {}
    for snapshot in held:
        sizes.update(snapshot.content)
    return sum(sizes.values())


def to_drop(held: Sequence[Held], keep: int, quota: int) -> list[Held]:
    """The snapshots to drop, oldest first."""
    by_computer: dict[str, list[Held]] = {}
    for snapshot in held:
        by_computer.setdefault(snapshot.trapos_id, []).append(snapshot)
    dropped: list[Held] = []
    kept: list[Held] = []
    for snapshots in by_computer.values():
        snapshots.sort(key=lambda s: s.seq, reverse=True)
        kept += snapshots[:keep]
        dropped += snapshots[keep:]
    kept.sort(key=lambda s: (s.created, s.seq, s.trapos_id))
    refs: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for snapshot in kept:
        refs.update(snapshot.content.keys())
        sizes.update(snapshot.content)
    used = sum(sizes.values())
    for snapshot in kept[:-1]:
        if used <= quota:
            break
        dropped.append(snapshot)
        for sha in snapshot.content:
            refs[sha] -= 1
            if not refs[sha]:
                used -= sizes[sha]
    dropped.sort(key=lambda s: (s.created, s.seq, s.trapos_id))
    return dropped
