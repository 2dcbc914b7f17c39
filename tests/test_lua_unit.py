"""Run the Lua unit tests in ``lua/tests/`` on real Lua 5.2, one pytest case per Lua case."""

from pathlib import Path

import pytest
from lupa import lua52

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
SUITES = {
    "sandbox": (LUA_DIR / "tests" / "sandbox.lua", LUA_DIR / "apis" / "libsandbox.lua"),
}


def _load_suite(name):
    test_file, lib_file = SUITES[name]
    lua = lua52.LuaRuntime(unpack_returned_tuples=True)
    # Lua 5.2 as CraftOS runs it: none of these exist there.
    lua.execute("unpack = nil; loadstring = nil; setfenv = nil; getfenv = nil")
    chunk = lua.eval("loadfile")(str(test_file))
    if chunk is None:
        raise RuntimeError(f"cannot load {test_file}")
    return chunk("--suite", str(lib_file))


def _case_ids():
    ids = []
    for suite_name in SUITES:
        names = _load_suite(suite_name).names()
        ids.extend((suite_name, names[i]) for i in range(1, len(names) + 1))
    return ids


@pytest.mark.parametrize(
    "suite_name,case", _case_ids(), ids=lambda v: v if isinstance(v, str) else None
)
def test_lua(suite_name, case):
    # A fresh runtime per case: no state leaks between cases.
    result = _load_suite(suite_name).run(case)
    ok, message = result if isinstance(result, tuple) else (result, None)
    assert ok is True, message


def test_lua_files_avoid_non_52_syntax():
    """CraftOS's Lua 5.2 has no integer division, bitwise operators or goto."""
    lua = lua52.LuaRuntime()
    load = lua.eval("load")
    for path in sorted(LUA_DIR.rglob("*.lua")):
        fn, err = load(path.read_text(), "@" + str(path)), None
        if isinstance(fn, tuple):
            fn, err = fn
        assert fn is not None, f"{path} does not compile as Lua 5.2: {err}"
        text = path.read_text()
        for token in ("unpack(", "loadstring(", "setfenv(", "getfenv("):
            for line in text.splitlines():
                stripped = line.split("--", 1)[0]
                if token in stripped and "table.unpack(" not in stripped:
                    pytest.fail(f"{path}: uses {token!r}: {line.strip()}")
        assert text.startswith("local _VERSION = '"), f"{path} must start with local _VERSION"
