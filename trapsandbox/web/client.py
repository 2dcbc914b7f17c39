"""
The Lua client files, served to computers for the one-line install:

    wget run http://HOST:4444/client/install.lua [password]

and, for a server admin, the same files as a data pack (``GET /client/datapack.zip``,
``trapsandbox-ctl datapack``): dropped in the world's ``datapacks/``, CC:Tweaked merges its
``data/computercraft/lua/rom/`` into every computer's ROM (tweaked.cc/reference/data_pack.html),
so every computer has ``sandbox``, ``require("libsandbox")``, ``help sandbox`` and an autorun
that starts the daemon once its player ran ``sandbox setup``.

They are read from ``lua/`` at each request, so what is served is always
what is in the tree (or installed beside the package), never a copy. The one file
``apis/libsandbox.lua`` (for ``wget run``, the installer and CraftOS-PC) is built at each
request from its modules, ``lua/sandbox/NAME.lua`` (:func:`build_libsandbox`); the copy of it in
the tree is for trapos's package (``lua/packages/trapos-sandbox``), which takes files from
``lua/`` as they are, and a test keeps it the same as the build
(``python -m trapsandbox.web.client`` writes it again). The data pack does not carry that file:
it carries the modules themselves, ``rom/modules/main/sandbox/NAME.lua``, and as
``rom/modules/main/libsandbox.lua`` a loader (:func:`pack_loader`) that runs them as the one
file does, each under the chunk name ``@sandbox/NAME.lua``.
"""

from __future__ import annotations

import functools
import io
import json
import re
import sys
import textwrap
import zipfile
from pathlib import Path

LIBRARY = "apis/libsandbox.lua"
FILES = (
    LIBRARY,
    "servers/sandbox.lua",
    "programs/sandbox.lua",
    "help/sandbox.txt",
    "help/sandbox-ask.txt",
    "help/sandbox-allow.txt",
    "help/sandbox-stop.txt",
    "help/sandbox-snapshots.txt",
)
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
    return served(name)


def served(name: str) -> bytes:
    """A file of ``lua/`` as served: the library built from its modules, the data pack's loader
    naming them, any other as it is."""
    if name == LIBRARY:
        return _built(_stamp())
    if name == PACK_LOADER:
        return pack_loader()
    return (lua_dir() / name).read_bytes()


def _stamp() -> tuple[int, ...]:
    """When each of libsandbox's modules last changed: what a built copy is good for."""
    root = lua_dir() / "sandbox"
    return tuple((root / f"{module}.lua").stat().st_mtime_ns for module in MODULES)


@functools.lru_cache(maxsize=1)
def _built(stamp: tuple[int, ...]) -> bytes:
    # Downloads and data packs are served to anyone: built once per change of the modules.
    return build_libsandbox()


# libsandbox's modules (lua/sandbox/NAME.lua), in the order they run: each uses only those
# before it (sandbox/core.lua lists what each owns).
MODULES = (
    "core",
    "consent",
    "encoding",
    "wire",
    "loop",
    "capture",
    "screen",
    "jobs",
    "handlers",
    "exec",
    "files",
    "snapshot",
    "console",
    "peripherals",
    "requests",
    "dispatch",
    "session",
    "api",
)
VERSION_LINE = re.compile(rb"local _VERSION = '([^'\\]*)'\n")
BUILD_HEADER = b"""--[[
libsandbox, built from its modules in lua/sandbox/ by trapsandbox.web.client.build_libsandbox:
change those, not this file. Each module is loaded under its own name, so an error or a
traceback names sandbox/NAME.lua and the line in it. sandbox/core.lua says what libsandbox is.
]]

local M, internal = {}, {}
local function loadModule(name, source)
  local chunk, err = load(source, '@sandbox/' .. name .. '.lua', 't', _ENV)
  if not chunk then error(err, 0) end
  chunk(M, internal)
end
"""


def long_bracket(source: bytes) -> tuple[bytes, bytes]:
    """Lua's long-bracket quotes (``[==[``, ``]==]``) of the lowest level that ``source`` does
    not close."""
    level = 0
    while b"]" + b"=" * level + b"]" in source + b"]":
        level += 1
    return b"[" + b"=" * level + b"[", b"]" + b"=" * level + b"]"


def build_libsandbox(root: Path | None = None) -> bytes:
    """
    The one-file libsandbox (``apis/libsandbox.lua``) from the modules in ``root/sandbox/``
    (default :func:`lua_dir`): each module's source, as it is, in a long string loaded with
    the chunk name ``@sandbox/NAME.lua``, so that Lua numbers its lines as in the module. Its
    first line is core's ``_VERSION``.
    """
    root = root or lua_dir()
    sources = [(name, (root / "sandbox" / f"{name}.lua").read_bytes()) for name in MODULES]
    version = VERSION_LINE.match(sources[0][1])
    if version is None:
        raise ValueError("sandbox/core.lua: no _VERSION on its first line")
    parts = [version.group(0), b"\n", BUILD_HEADER]
    for name, source in sources:
        if not source.endswith(b"\n"):
            source += b"\n"
        # A newline right after the opening bracket is not part of the string: line 1 stays 1.
        opening, closing = long_bracket(source)
        parts.append(b"\nloadModule('" + name.encode() + b"', " + opening + b"\n")
        parts.append(source + closing + b")\n")
    parts.append(b"\nreturn M\n")
    return b"".join(parts)


def installer(host: bytes | None, secure: bool) -> bytes | None:
    """The installer, pointed at this gateway; None if ``host`` is not a plain host[:port]."""
    base = base_url(host, secure)
    if base is None:
        return None
    line = BASE_URL_LINE.replace(b"__TRAPSANDBOX_BASE_URL__", base.encode("ascii"))
    return (lua_dir() / INSTALLER).read_bytes().replace(BASE_URL_LINE, line, 1)


def pack_loader() -> bytes:
    """
    The data pack's ``require("libsandbox")`` (``lua/datapack/libsandbox.lua``): a loader of the
    modules the pack carries beside it, ``sandbox/NAME.lua``, with :data:`MODULES` written into
    it, run in that order as :func:`build_libsandbox` runs them.
    """
    source = (lua_dir() / PACK_LOADER).read_bytes()
    if source.count(MODULES_LINE) != 1:
        raise ValueError(f"{PACK_LOADER}: no {MODULES_LINE!r} line to write the modules in")
    names = b", ".join(b"'" + name.encode() + b"'" for name in MODULES)
    lines = textwrap.wrap(names.decode(), 96, break_on_hyphens=False)
    listed = b"local MODULES = {\n" + b"".join(f"  {line}\n".encode() for line in lines) + b"}\n"
    return source.replace(MODULES_LINE, listed)


# The data pack: where each file of ``lua/`` goes under data/computercraft/lua/rom/ (names lower
# case, as CC:Tweaked requires). libsandbox is its modules, each as it is
# (rom/modules/main/sandbox/NAME.lua), and the loader that runs them
# (rom/modules/main/libsandbox.lua), not the one-file build. The gateway's URL, when the pack
# carries one, is rom/modules/main/sandbox/gateway.lua (``require("sandbox.gateway")``, read by
# ``sandbox setup``): no module may be called gateway.
ROM = "data/computercraft/lua/rom/"
PACK_LOADER = "datapack/libsandbox.lua"
# The loader's line that the modules' names are written into.
MODULES_LINE = b"local MODULES = {}\n"
DATAPACK = {
    "programs/sandbox.lua": "programs/sandbox.lua",
    PACK_LOADER: "modules/main/libsandbox.lua",
    **{f"sandbox/{name}.lua": f"modules/main/sandbox/{name}.lua" for name in MODULES},
    "servers/sandbox.lua": "sandbox/daemon.lua",
    "datapack/autorun/sandbox.lua": "autorun/sandbox.lua",
    "help/sandbox.txt": "help/sandbox.txt",
    "help/sandbox-ask.txt": "help/sandbox-ask.txt",
    "help/sandbox-allow.txt": "help/sandbox-allow.txt",
    "help/sandbox-stop.txt": "help/sandbox-stop.txt",
    "help/sandbox-snapshots.txt": "help/sandbox-snapshots.txt",
}
GATEWAY_MODULE = "modules/main/sandbox/gateway.lua"
# Minecraft 1.20.1's data pack format, the version CC:Tweaked 1.113.1 is built for; a newer
# game lists the pack as made for an older version and loads it all the same.
PACK_FORMAT = 15
_URL = re.compile(r"(https?|wss?)://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?\Z")


def base_url(host: bytes | None, secure: bool) -> str | None:
    """The base URL of a gateway reached by ``host``; None if it is not host[:port]."""
    if not host or not _HOST.match(host):
        return None
    return ("https://" if secure else "http://") + host.decode("ascii")


def valid_url(url: str) -> bool:
    """Whether ``url`` may name the gateway in a data pack (http(s):// or ws(s)://, no query)."""
    return bool(_URL.match(url))


def datapack(url: str | None = None) -> bytes:
    """
    The data pack as a zip, carrying ``url`` (the gateway's base or WebSocket URL) when given.
    The same files give the same bytes: entries are sorted and dated 1980-01-01.
    """
    if url is not None and not valid_url(url):
        raise ValueError(f"not a gateway URL: {url!r}")
    pack = _pack(_stamp(), tuple((lua_dir() / source).stat().st_mtime_ns for source in DATAPACK))
    if url is None:
        return pack
    # The gateway's URL (from the Host a request names) is added to the pack built once, not
    # a new pack deflated per request.
    out = io.BytesIO(pack)
    with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as made:
        _add(
            made,
            ROM + GATEWAY_MODULE,
            b"-- The gateway this data pack was made for (`sandbox setup` offers it).\n"
            b"return { url = '" + url.encode("ascii") + b"' }\n",
        )
    return out.getvalue()


def _add(pack: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    pack.writestr(info, data)


@functools.lru_cache(maxsize=1)
def _pack(*stamps: tuple[int, ...]) -> bytes:
    """The data pack without a gateway's URL, for the files as they are at ``stamps``."""
    entries: dict[str, bytes] = {}
    meta = {
        "pack": {
            "pack_format": PACK_FORMAT,
            "description": "trapsandbox: the sandbox command on every computer",
        }
    }
    entries["pack.mcmeta"] = json.dumps(meta, indent=2).encode() + b"\n"
    for source, target in DATAPACK.items():
        entries[ROM + target] = served(source)
    if ROM + GATEWAY_MODULE in entries:
        raise ValueError(f"a client file is {GATEWAY_MODULE}, where the gateway's URL goes")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as pack:
        for name in sorted(entries):
            _add(pack, name, entries[name])
    return out.getvalue()


if __name__ == "__main__":
    # Writes lua/apis/libsandbox.lua again from the modules (the copy trapos's package takes).
    (lua_dir() / LIBRARY).write_bytes(build_libsandbox())
