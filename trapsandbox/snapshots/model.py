"""
What a snapshot is (SPEC §15), its errors, and the checks at the store's boundary.

A snapshot is ``{id, account, traposId, created, reason, files}``: ``files`` maps each
absolute CraftOS path to ``{size, modified, sha256}`` (``modified`` in epoch ms, as
``fs.attributes`` gives it); the bytes are stored once per account under their SHA-256.
``id`` is the computer's own sequence number as a string (``"1"``, ``"2"``, ...), never
reused, so "newest first" does not depend on clocks and an id is easy to type
(``trapsandbox-ctl restore 1: 7``).

``/.settings`` (any spelling CraftOS folds to it) holds the computer's credential: a files
map naming it is refused here, so no store ever holds it.  The checks live here, once, and
both stores call them before touching anything.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import orjson

from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.computers.settingsfile import is_settings_path
from trapsandbox.errors import GatewayError

REASONS = ("ask", "manual", "restore")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


class NotFound(GatewayError):
    """No such snapshot or content for this account: another account's answers the same."""

    def __init__(self, message: str) -> None:
        super().__init__(errors.NOT_FOUND, message)


class MissingContent(GatewayError):
    """A commit named content the store does not hold: nothing was committed."""

    def __init__(self, hashes: Iterable[str]) -> None:
        self.hashes = sorted(hashes)
        shown = ", ".join(h[:12] for h in self.hashes[:5])
        more = f" and {len(self.hashes) - 5} more" if len(self.hashes) > 5 else ""
        super().__init__(
            errors.BAD_REQUEST,
            f"the snapshot's content is not all stored ({shown}{more}): nothing was committed",
        )


def unavailable(message: str) -> GatewayError:
    """The store cannot be reached or failed; the message says why (never a secret)."""
    return GatewayError(errors.UNAVAILABLE, f"the snapshot store: {message}")


def bad(message: str) -> GatewayError:
    return GatewayError(errors.BAD_REQUEST, message)


@attrs.frozen
class FileEntry:
    size: int
    modified: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "modified": self.modified, "sha256": self.sha256}


Files = Mapping[str, FileEntry]


@attrs.frozen
class Summary:
    """One line of a computer's list: the snapshot without its files map."""

    id: str
    account: str
    trapos_id: str
    created: int
    reason: str
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "account": self.account,
            "traposId": self.trapos_id,
            "created": self.created,
            "reason": self.reason,
            "files": self.files,
            "bytes": self.bytes,
        }


@attrs.frozen
class Snapshot:
    id: str
    account: str
    trapos_id: str
    created: int
    reason: str
    files: Files


@attrs.frozen
class Pruned:
    """What a prune removed."""

    snapshots: tuple[tuple[str, str], ...]  # (traposId, id)
    content: int
    content_bytes: int


# -- Checks at the boundary ------------------------------------------------------------------


def check_name(value: object, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= limits.MAX_ID_LENGTH or "\0" in value:
        raise bad(f"{what} must be a string of 1 to {limits.MAX_ID_LENGTH} characters")
    return value


def check_sha256(value: object) -> str:
    if type(value) is not str or not _SHA256.match(value):
        raise bad("a content hash must be 64 lower-case hex digits (SHA-256)")
    return value


def check_reason(value: object) -> str:
    if value not in REASONS:
        raise bad(f"a snapshot's reason is one of {', '.join(REASONS)}")
    return value  # type: ignore[return-value]


def sequence(snapshot_id: object) -> int | None:
    """The sequence number an id names; None when it names none (answered as not found)."""
    if type(snapshot_id) is str and snapshot_id.isascii() and snapshot_id.isdigit():
        if len(snapshot_id) <= 18 and snapshot_id[0] != "0":
            return int(snapshot_id)
    return None


def check_path(path: object) -> str:
    if (
        type(path) is not str
        or not path.startswith("/")
        or "\0" in path
        or len(path) > limits.SNAPSHOT_MAX_PATH_CHARS
    ):
        raise bad(
            "a snapshot's path must be absolute (start with /), without NUL, "
            f"at most {limits.SNAPSHOT_MAX_PATH_CHARS} characters"
        )
    if is_settings_path(path):
        raise GatewayError(
            errors.FORBIDDEN,
            f"{wire.cut(path)} is the computer's settings file: a snapshot never holds it",
        )
    return path


def _whole(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise bad(f"a file's {what} must be a whole number >= 0")
    return value


def entry(value: object) -> FileEntry:
    """A ``FileEntry``, or one from its JSON form ``{size, modified, sha256}``."""
    if isinstance(value, FileEntry):
        value = value.to_json()
    if not isinstance(value, Mapping):
        raise bad("a file must be {size, modified, sha256}")
    return FileEntry(
        _whole(value.get("size"), "size"),
        _whole(value.get("modified"), "modified time"),
        check_sha256(value.get("sha256")),
    )


def check_files(files: object, max_bytes: int) -> dict[str, FileEntry]:
    """A files map to commit, checked whole: paths, entries, the count and the size bound."""
    if not isinstance(files, Mapping):
        raise bad("a snapshot's files must be a map of path -> {size, modified, sha256}")
    if len(files) > limits.SNAPSHOT_MAX_FILES:
        raise GatewayError(
            errors.TOO_LARGE,
            f"{len(files)} files: a snapshot holds at most {limits.SNAPSHOT_MAX_FILES}",
        )
    checked = {check_path(path): entry(value) for path, value in files.items()}
    check_total(sum(e.size for e in checked.values()), max_bytes)
    return checked


def check_total(size: int, max_bytes: int) -> None:
    """
    The computer's files add up to ``size`` bytes: refused past ``max_bytes`` (the
    store's, from SANDBOX_SNAPSHOT_MAX_MB), not half-saved.
    """
    if size > max_bytes:
        raise GatewayError(
            errors.TOO_LARGE,
            f"the computer's files take {size} bytes: a snapshot holds at most "
            f"{max_bytes} bytes (SANDBOX_SNAPSHOT_MAX_MB)",
        )


def check_content(sha256: object, data: object, max_bytes: int) -> bytes:
    """``data`` whose SHA-256 is ``sha256``, within the bound of one snapshot."""
    check_sha256(sha256)
    if not isinstance(data, bytes):
        raise bad("content must be bytes")
    check_total(len(data), max_bytes)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise bad(f"the content's SHA-256 is not {sha256[:12]}...: not stored")
    return data


def manifest(files: Files) -> bytes:
    """
    A files map as both stores keep it, and as the quota counts it (``retention``): JSON
    ``{path: [size, modified, sha256]}``.
    """
    return orjson.dumps({path: [e.size, e.modified, e.sha256] for path, e in files.items()})


def from_manifest(data: bytes | Mapping[str, Any]) -> dict[str, FileEntry]:
    """A files map from ``manifest``'s bytes (or their decoded JSON)."""
    listed = orjson.loads(data) if isinstance(data, bytes | bytearray | memoryview) else data
    return {path: FileEntry(*entry) for path, entry in listed.items()}


def sized(files: Files) -> tuple[int, int]:
    """(count, total bytes) of a files map."""
    return len(files), sum(e.size for e in files.values())
