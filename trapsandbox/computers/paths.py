"""
One rule for a path on a computer (issue 43): every surface (the HTTP file routes,
``/operator``'s file requests and changes, the MCP tools, ``trapsandbox-ctl`` through the
routes, a restore) makes a path canonical here once, before any check compares it or any
request carries it, so that ``/proj/../proj/inner``, ``proj\\inner`` and ``/proj//inner/.``
are one path and no check compares raw strings.

``canonical(path, cwd=None)`` is CraftOS's own reading (``fs.combine``): ``/`` and ``\\``
separate parts; empty, ``.`` and all-dot parts go; ``..`` takes the part before it; spaces
around a part are trimmed.  What CraftOS would quietly drop or cut (``"*:<>?|`` and control
characters, ``..`` above the root, a name of 255 bytes or more) is refused with
``bad_request`` instead, so the canonical path is exactly the one the computer acts on.  It
is pure and cheap: a key as well as a check (MCP's ``files/./notes.txt`` and
``files/notes.txt`` are one resource).

``checked(path, cwd=None, write=False)`` is ``canonical`` and what no file request may name:
the settings file (``settingsfile``: ``forbidden``); for a change, the root and ``/rom``
(read-only on every CraftOS).  Other read-only places (a mounted disk's, a treasure disk)
only the computer knows; it refuses them itself.

``inside(child, parent)``: whether ``child`` is ``parent`` or under it, as any CraftOS could
read them (a host may ignore case; CraftOS-PC drops non-ASCII bytes, so ``/pr\u00e9oj`` may
be ``/proj``).
"""

from __future__ import annotations

import re
from typing import Any

from trapsandbox import errors, limits
from trapsandbox.computers.settingsfile import is_settings_path
from trapsandbox.errors import GatewayError

ROOT = "/"
ROM = "/rom"
# What CraftOS drops from a path (both emulators, and fs.open in CC:Tweaked for ``*``).
_DROPPED = re.compile(r'[\x00-\x1f\x7f"*:<>?|]')
_SEPARATORS = re.compile(r"[/\\]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
# CraftOS cuts a longer name (CC:Tweaked at 255 characters, CraftOS-PC at 255 bytes).
MAX_NAME_BYTES = 254


def _parts(path: str, name: str, into: list[str]) -> None:
    for raw in _SEPARATORS.split(path):
        part = raw.strip(" ")
        if part == "..":
            if not into:
                raise errors.bad_request(f"{name} goes above the root folder: {path!r}")
            into.pop()
        elif part and part.strip("."):
            if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
                raise errors.bad_request(
                    f"{name} has a name of over {MAX_NAME_BYTES} bytes, which CraftOS would cut"
                )
            into.append(part)


def canonical(path: object, cwd: str | None = None, name: str = "path") -> str:
    """
    ``path`` (absolute, or relative to ``cwd``, itself relative to the root) as CraftOS
    reads it: ``/`` and its parts (``"/"`` for the root).  Raises ``bad_request`` (naming
    the field ``name``) for what is not a path or what CraftOS would change silently.
    """
    if type(path) is not str:
        raise errors.bad_request(f"{name} must be a path on the computer (a string)")
    if len(path) > limits.MAX_PATH_LENGTH:
        raise errors.bad_request(f"{name} is over {limits.MAX_PATH_LENGTH} characters")
    dropped = _DROPPED.search(path) or (cwd is not None and _DROPPED.search(cwd))
    if dropped:
        raise errors.bad_request(
            f"{name} holds {dropped.group()!r}, which CraftOS drops from a path: "
            'no path holds a control character or any of "*:<>?|'
        )
    parts: list[str] = []
    if cwd is not None and not path.startswith(("/", "\\")):
        if len(cwd) > limits.MAX_PATH_LENGTH:
            raise errors.bad_request(f"cwd is over {limits.MAX_PATH_LENGTH} characters")
        _parts(cwd, "cwd", parts)
    _parts(path, name, parts)
    return "/" + "/".join(parts)


def checked(
    path: object, cwd: str | None = None, *, write: bool = False, name: str = "path"
) -> str:
    """
    ``canonical(path, cwd)``, refused (``GatewayError``) when no file request may name it:
    the settings file (``forbidden``); to change (``write``), the root (``bad_request``)
    or ``/rom`` (``fs_error``, as CraftOS says it).
    """
    full = canonical(path, cwd, name)
    if is_settings_path(full) or is_settings_path(path, cwd):  # type: ignore[arg-type]
        raise GatewayError(
            errors.FORBIDDEN,
            f"{full} is the computer's settings file and holds its sandbox password: "
            "file requests may not read, list, write or delete it",
        )
    if write:
        if full == ROOT:
            raise errors.bad_request(f"{name} is the root folder, which cannot be changed")
        if inside(full, ROM):
            raise GatewayError(errors.FS_ERROR, f"{full}: Access denied (/rom is read-only)")
    return full


# The requests to a computer that name paths, and those of them that change what they name.
FILE_REQUESTS = frozenset(
    {
        "list_files",
        "read_file",
        "write_file",
        "write_files",
        "delete_file",
        "move_file",
        "make_folder",
    }
)
CHANGES = frozenset({"write_file", "write_files", "delete_file", "move_file", "make_folder"})


def request_paths(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """
    ``payload`` of a ``kind`` request with every path it names canonical and checked
    (``checked``; a ``move_file`` not into itself), whichever surface sent it: the registry
    applies it to every request (``hooks.FilePaths``), so no request reaches a computer, and
    no listener hears of a change, with a path in another spelling.  Raises ``GatewayError``.
    """
    if kind not in FILE_REQUESTS:
        return payload
    cwd = payload.get("cwd")
    if cwd is not None and type(cwd) is not str:
        raise errors.bad_request("cwd must be a path on the computer (a string)")
    made = {key: value for key, value in payload.items() if key != "cwd"}
    if kind == "write_files":
        made["files"] = [_batched(entry, cwd, n) for n, entry in enumerate(_files(payload))]
        return made
    fields = ("from", "to") if kind == "move_file" else ("path",)
    for field in fields:
        made[field] = checked(payload.get(field), cwd, write=kind in CHANGES, name=field)
    if kind == "move_file" and inside(made["to"], made["from"]):
        raise errors.bad_request("to must not be from itself or inside it")
    return made


def _files(payload: dict[str, Any]) -> list[Any]:
    files = payload.get("files")
    if type(files) is not list or not files:
        raise errors.bad_request("files must be a list of {path, size}")
    if len(files) > limits.BATCH_FILES:
        raise errors.bad_request(f"at most {limits.BATCH_FILES} files in one write_files")
    return files


def _batched(entry: object, cwd: str | None, n: int) -> dict[str, Any]:
    """One file of a ``write_files``, its path checked as a write's."""
    if type(entry) is not dict:
        raise errors.bad_request(f"files[{n}] must be {{path, size}}")
    return {**entry, "path": checked(entry.get("path"), cwd, write=True, name=f"files[{n}].path")}


def _within(child: str, parent: str) -> bool:
    return parent == ROOT or child == parent or child.startswith(parent + "/")


def inside(child: str, parent: str) -> bool:
    """Whether the canonical ``child`` is the canonical ``parent`` or a path under it, as
    any CraftOS could read them: on a host whose names ignore case (as CC:Tweaked's own
    check does), and with non-ASCII bytes dropped (as CraftOS-PC does)."""
    if _within(child.lower(), parent.lower()):
        return True
    if _NON_ASCII.search(child) or _NON_ASCII.search(parent):
        # (Dropping can empty a name or make one "..": fold again; what cannot be read so
        # is taken to overlap, the safe side for a move's check and a lock.)
        try:
            child, parent = (canonical(_NON_ASCII.sub("", p)).lower() for p in (child, parent))
        except GatewayError:
            return True
        return _within(child, parent)
    return False


def parent(path: str) -> str:
    """The folder holding the canonical ``path`` (the root's is the root)."""
    head = path.rsplit("/", 1)[0]
    return head or ROOT
