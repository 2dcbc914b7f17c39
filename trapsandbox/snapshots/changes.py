"""
Changes and restore plans (SPEC §15), as pure functions: no I/O, so the wiring fetches and
writes and these decide what.

- ``to_fetch``: the paths whose size or modification time differ from the latest snapshot
  (or are new): only those travel.  A file whose time moved is fetched even when its size
  did not (``fs.attributes(path).modified`` is in ms: a same-size change in the same
  millisecond is the one case the listing cannot see).
- ``changes``: added, modified and deleted paths with sizes, between a snapshot and the
  computer's listing now (plus the hashes of what was fetched).
- ``text_diff``: a bounded unified diff of a modified file, or one line saying it is
  binary or too large.
- ``restore_plan``: what to delete, then what to write back, so the computer's files equal
  the snapshot's; ``restore_space``: the free space it needs, known before anything moves.

``/.settings`` (any spelling) is never fetched, reported, written or deleted.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import attrs

from trapsandbox import limits
from trapsandbox.computers.settingsfile import is_settings_path
from trapsandbox.snapshots.model import FileEntry

# What the computer lists now: path -> (size, modified ms).
Listing = Mapping[str, tuple[int, int]]


@attrs.frozen
class Change:
    path: str
    before: int | None  # its size in the snapshot (None: added)
    after: int | None  # its size now (None: deleted)

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "before": self.before, "after": self.after}


@attrs.frozen
class Changes:
    added: tuple[Change, ...]
    modified: tuple[Change, ...]
    deleted: tuple[Change, ...]

    def __len__(self) -> int:
        return len(self.added) + len(self.modified) + len(self.deleted)

    def to_json(self) -> dict[str, object]:
        return {
            "added": [c.to_json() for c in self.added],
            "modified": [c.to_json() for c in self.modified],
            "deleted": [c.to_json() for c in self.deleted],
        }


@attrs.frozen
class RestorePlan:
    """Deletions first (a directory where the snapshot has a file goes whole), then writes."""

    delete: tuple[str, ...]
    write: tuple[tuple[str, str], ...]  # (path, sha256)

    def to_json(self) -> dict[str, object]:
        return {
            "delete": list(self.delete),
            "write": [{"path": p, "sha256": s} for p, s in self.write],
        }


def to_fetch(latest: Mapping[str, FileEntry], listing: Listing) -> list[str]:
    """The listed paths whose content must be fetched: new, or size or time moved."""
    out = []
    for path, (size, modified) in listing.items():
        if is_settings_path(path):
            continue
        old = latest.get(path)
        if old is None or (old.size, old.modified) != (size, modified):
            out.append(path)
    return sorted(out)


def changes(
    snapshot: Mapping[str, FileEntry], listing: Listing, hashes: Mapping[str, str]
) -> Changes:
    """
    From ``snapshot`` to the computer now.  ``hashes`` holds the SHA-256 of what was fetched
    (``to_fetch``): a fetched file is modified when its hash differs (a file merely touched
    is not); one not fetched whose size or time moved is counted modified.
    """
    added, modified = [], []
    for path, (size, when) in listing.items():
        if is_settings_path(path):
            continue
        old = snapshot.get(path)
        if old is None:
            added.append(Change(path, None, size))
        elif path in hashes:
            if hashes[path] != old.sha256:
                modified.append(Change(path, old.size, size))
        elif (old.size, old.modified) != (size, when):
            modified.append(Change(path, old.size, size))
    deleted = [
        Change(path, old.size, None)
        for path, old in snapshot.items()
        if path not in listing and not is_settings_path(path)
    ]
    return Changes(*(tuple(sorted(c, key=lambda c: c.path)) for c in (added, modified, deleted)))


def text_diff(
    path: str,
    before: bytes,
    after: bytes,
    max_bytes: int = limits.SNAPSHOT_DIFF_MAX_BYTES,
    max_lines: int = limits.SNAPSHOT_DIFF_MAX_LINES,
) -> str:
    """A unified diff of ``path`` cut after ``max_lines``; or one line for binary or large."""
    sizes = f"{len(before)} bytes -> {len(after)} bytes"
    if len(before) > max_bytes or len(after) > max_bytes:
        return f"{path}: too large to compare, {sizes}"
    try:
        old, new = before.decode("utf-8"), after.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path}: binary, {sizes}"
    if "\0" in old or "\0" in new:
        return f"{path}: binary, {sizes}"
    lines = []
    diff = difflib.unified_diff(
        old.splitlines(), new.splitlines(), f"a{path}", f"b{path}", lineterm=""
    )
    for count, line in enumerate(diff):
        if count == max_lines:
            lines.append(f"... cut at {max_lines} lines")
            break
        lines.append(line)
    return "\n".join(lines)


def restore_plan(
    snapshot: Mapping[str, FileEntry], current: Mapping[str, FileEntry]
) -> RestorePlan:
    """
    What makes ``current`` (the computer's files, as a fresh snapshot holds them) equal
    ``snapshot``: files created since are deleted, modified and deleted ones written back.
    A path the snapshot has as a file but that is a directory now is deleted whole first.
    """
    write = [
        (path, entry.sha256)
        for path, entry in snapshot.items()
        if not is_settings_path(path)
        and (path not in current or current[path].sha256 != entry.sha256)
    ]
    written = {path for path, _ in write}
    delete = {path for path in current if path not in snapshot and not is_settings_path(path)}
    for path in written:
        inside = {p for p in delete if p.startswith(path + "/")}
        if inside:
            delete -= inside
            delete.add(path)
    return RestorePlan(tuple(sorted(delete)), tuple(sorted(write)))


# CC:Tweaked counts every file and folder as at least this many bytes of the computer's disk.
FILE_COST = 500


def _cost(size: int) -> int:
    return max(size, FILE_COST)


def restore_space(
    plan: RestorePlan, snapshot: Mapping[str, FileEntry], current: Mapping[str, FileEntry]
) -> int:
    """
    The free bytes ``plan`` needs on the computer at its fullest moment.  Deletions come
    first and free what they held; each file is then written whole beside the one it
    replaces, which stays until the new one is in place: so at most the growth of every
    write, plus the largest file written over another, plus a cost per folder to make.
    """
    gone = plan.delete
    freed = sum(
        _cost(entry.size)
        for path, entry in current.items()
        if any(path == d or path.startswith(d + "/") for d in gone)
    )
    kept = {path: entry for path, entry in current.items() if path not in gone}
    folders = {folder for path in kept for folder in _folders(path)}
    growth = beside = 0
    new_folders: set[str] = set()
    for path, _ in plan.write:
        new = _cost(snapshot[path].size)
        old = kept.get(path)
        growth += max(0, new - (_cost(old.size) if old else 0))
        if old:
            beside = max(beside, new)
        new_folders.update(_folders(path))
    return max(0, growth + beside + FILE_COST * len(new_folders - folders) - freed)


def _folders(path: str) -> list[str]:
    """The folders ``path`` is in, the root left out: /a/b/c -> /a/b, /a."""
    parts = path.split("/")[1:-1]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]
