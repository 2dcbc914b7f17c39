"""
The Lua client files, served to computers for the one-line install:

    wget run http://HOST:4444/client/install.lua [password]

They are read from ``lua/`` at each request, so what is served is always
what is in the tree (or installed beside the package), never a copy.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

FILES = ("apis/libsandbox.lua", "servers/sandbox.lua", "programs/sandbox.lua")
INSTALLER = "install.lua"
# The installer's line that names the gateway; served with the gateway's base URL.
BASE_URL_LINE = b"local BASE_URL = '__TRAPSANDBOX_BASE_URL__'"

# What may stand in a Host header: it is written into Lua source.
_HOST = re.compile(rb"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?\Z")


def lua_dir() -> Path:
    """``lua/`` of the source tree, or as installed under ``share/trapsandbox``."""
    tree = Path(__file__).resolve().parents[2] / "lua"
    if tree.is_dir():
        return tree
    return Path(sys.prefix) / "share" / "trapsandbox" / "lua"


def read(name: str) -> bytes | None:
    """One of ``FILES``, or None for any other name."""
    if name not in FILES:
        return None
    return (lua_dir() / name).read_bytes()


def installer(host: bytes | None, secure: bool) -> bytes | None:
    """The installer, pointed at this gateway; None if ``host`` is not a plain host[:port]."""
    if not host or not _HOST.match(host):
        return None
    base = (b"https://" if secure else b"http://") + host
    line = BASE_URL_LINE.replace(b"__TRAPSANDBOX_BASE_URL__", base)
    return (lua_dir() / INSTALLER).read_bytes().replace(BASE_URL_LINE, line, 1)
