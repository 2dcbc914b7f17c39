"""
The computer's credential stays on it (SPEC §9): ``/.settings`` holds its
``sandbox.password``, so the gateway refuses file requests on it with
``forbidden`` before sending them, and the computer refuses them too.

This is the twin of ``isSettingsPath`` in ``lua/sandbox/handlers.lua`` (which
explains the rule); ``tests/unit/computers/test_settingsfile.py`` checks that the two
agree on generated paths.  Paths are compared as bytes, as CraftOS sees them.
"""

from __future__ import annotations

import re

SETTINGS_FILE = b".settings"

# What CraftOS drops from a path: control and non-ASCII bytes and "*:<>?| (Lua's %c is
# 0-31 and 127).
_DROPPED = re.compile(rb'[\x00-\x1f\x7f-\xff"*:<>?|]')
_TRIMMED = bytes(range(33)) + b"\x7f"  # Lua's [%c ]
_SEPARATORS = re.compile(rb"[/\\]")


def _fold(path: bytes) -> list[bytes]:
    parts: list[bytes] = []
    for raw in _SEPARATORS.split(path):
        part = raw.strip(_TRIMMED)
        if part == b"..":
            if parts:
                parts.pop()
        elif part and part.strip(b"."):
            parts.append(part)
    return parts


def _names_settings(parts: list[bytes]) -> bool:
    if not parts:
        return False
    name = parts[0].lower()
    if len(name) >= 255:
        return name.startswith(SETTINGS_FILE)
    return name.rstrip(b". ") == SETTINGS_FILE


def is_settings_path(path: str, cwd: str | None = None) -> bool:
    """Whether ``path`` (absolute, or relative to ``cwd``) is ``/.settings`` or under it."""
    joined = path.encode("utf-8", "surrogatepass")
    if not joined.startswith((b"/", b"\\")):
        joined = (cwd or "").encode("utf-8", "surrogatepass") + b"/" + joined
    folded = b"/".join(_fold(joined))
    return _names_settings(_fold(_DROPPED.sub(b"", joined))) or _names_settings(
        _fold(_DROPPED.sub(b"", folded))
    )
