"""Plain Lua 5.2 (lupa) as the Lua unit tests run it: without what CraftOS lacks, with
CC:Tweaked's ``cc.expect`` on ``package.path`` (``tests/harness/rom``, a copy of the ROM's
file), and libsandbox as the gateway serves it (built from ``lua/sandbox/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lupa import lua52

from trapsandbox.web import client

ROM_COPY = Path(__file__).with_name("rom")


def runtime() -> Any:
    """A fresh Lua 5.2 runtime: no global unpack, loadstring, setfenv or getfenv (CraftOS has
    none), and ``require("cc.expect")`` finding CC:Tweaked's file."""
    lua = lua52.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("unpack = nil; loadstring = nil; setfenv = nil; getfenv = nil")
    lua.globals().package.path = str(ROM_COPY / "modules" / "main" / "?.lua").encode()
    return lua


def load(lua: Any, source: bytes, name: str) -> Any:
    """``source`` compiled in ``lua`` as the chunk ``name`` (``@path`` or ``=name``)."""
    loaded = lua.eval("load")(source, name)
    if isinstance(loaded, tuple):
        chunk, err = loaded
        if chunk is None:
            raise RuntimeError(f"{name}: {err}")
        return chunk
    return loaded


def libsandbox(lua: Any) -> Any:
    """The one-file libsandbox, built from its modules, compiled in ``lua`` (not yet run)."""
    return load(lua, client.build_libsandbox(), "@apis/libsandbox.lua")
