"""
What an account's snapshots take against its quota, and which a prune drops (SPEC §15): pure
functions both stores call, so both count alike.

What is counted is what the stores keep (issue 43: empty files with long paths cost no
content, yet their lists filled the disk uncounted):

- each snapshot's file list: ``model.manifest``, the JSON both stores keep byte for byte,
  plus ``SNAPSHOT_LIST_OVERHEAD`` (its row or key, its entry in the computer's list);
- each content hash the kept snapshots use, once, as it is stored once: its size plus
  ``SNAPSHOT_CONTENT_OVERHEAD`` (its row and index entry, or its key and the hash's entries
  in the account's sets).

A prune drops:

1. Per computer, all but the newest ``keep``.
2. Then across the account (every traposId: a new one buys nothing), oldest first, until
   what the rest take is within ``quota``.  The account's newest snapshot always stays: the
   one just taken before an ask must survive its own prune (it fits: ``check_fits`` refused
   it at commit otherwise; only a quota lowered since can leave it over).

What the dropped snapshots used and no kept one uses is then removed by the store, never
content a kept snapshot uses (the stores sweep only content nothing references).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import attrs

from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots import model


@attrs.frozen
class Held:
    """A stored snapshot as retention sees it: whose, how old, what it takes."""

    trapos_id: str
    seq: int
    created: int
    content: Mapping[str, int]  # sha256 -> size
    listed: int  # its file list as kept: ``listed_bytes``


def listed_bytes(manifest: bytes) -> int:
    """What a snapshot's file list takes: its ``model.manifest`` as kept, and the rest."""
    return len(manifest) + limits.SNAPSHOT_LIST_OVERHEAD


def content_bytes(sizes: Mapping[str, int]) -> int:
    """What the content ``sizes`` names takes (sha256 -> size, each hash once)."""
    return sum(sizes.values()) + len(sizes) * limits.SNAPSHOT_CONTENT_OVERHEAD


def held(trapos_id: str, seq: int, created: int, files: model.Files, manifest: bytes) -> Held:
    """A stored snapshot: its ``files`` and their list as kept (``model.manifest(files)``)."""
    content = {e.sha256: e.size for e in files.values()}
    return Held(trapos_id, seq, created, content, listed_bytes(manifest))


def cost(files: model.Files) -> int:
    """What a snapshot of ``files`` takes alone: its list and its content."""
    return listed_bytes(model.manifest(files)) + content_bytes(
        {e.sha256: e.size for e in files.values()}
    )


def check_fits(files: model.Files, quota: int) -> int:
    """A snapshot of ``files`` that could not fit the account's quota even alone is refused
    before anything is saved; else what it takes."""
    size = cost(files)
    if size > quota:
        raise GatewayError(
            errors.TOO_LARGE,
            f"a snapshot of these {len(files)} files takes {size} bytes (their list and "
            f"content): an account's snapshots hold at most {quota} bytes "
            "(SANDBOX_SNAPSHOT_QUOTA_MB): nothing was saved",
        )
    return size


def used_bytes(held: Iterable[Held]) -> int:
    """What ``held`` takes: every list, and the content it uses, each hash once."""
    sizes: dict[str, int] = {}
    lists = 0
    for snapshot in held:
        sizes.update(snapshot.content)
        lists += snapshot.listed
    return lists + content_bytes(sizes)


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
    for snapshot in kept:
        refs.update(snapshot.content.keys())
    used = used_bytes(kept)
    for snapshot in kept[:-1]:
        if used <= quota:
            break
        dropped.append(snapshot)
        used -= snapshot.listed
        for sha, size in snapshot.content.items():
            refs[sha] -= 1
            if not refs[sha]:
                used -= size + limits.SNAPSHOT_CONTENT_OVERHEAD
    dropped.sort(key=lambda s: (s.created, s.seq, s.trapos_id))
    return dropped
