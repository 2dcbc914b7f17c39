"""Run the Lua unit tests in ``lua/tests/`` on real Lua 5.2, one test method per Lua case.

The methods are generated on trial ``SynchronousTestCase`` classes rather than parametrized
pytest functions: a plain pytest function would start pytest-twisted's reactor greenlet, and
the trial test cases that run after it could no longer run the reactor themselves.
"""

import json
import re
from pathlib import Path

from lupa import lua52
from twisted.trial.unittest import SynchronousTestCase

import trapsandbox

LUA_DIR = Path(__file__).resolve().parents[2] / "lua"
LIB = LUA_DIR / "apis" / "libsandbox.lua"


def load_suite(test_file, lib_file=LIB):
    """A fresh Lua 5.2 runtime (without what CraftOS lacks) holding the suite in test_file."""
    lua = lua52.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("unpack = nil; loadstring = nil; setfenv = nil; getfenv = nil")
    chunk = lua.eval("loadfile")(str(test_file))
    if chunk is None:
        raise RuntimeError(f"cannot load {test_file}")
    return chunk("--suite", str(lib_file))


def _method_name(case):
    return "test_" + re.sub(r"\W+", "_", case).strip("_")


def _make_test(test_file, case):
    def test(self):
        result = load_suite(test_file).run(case)  # a fresh runtime per case
        ok, message = result if isinstance(result, tuple) else (result, None)
        self.assertIs(ok, True, message)

    test.__doc__ = case
    return test


def _suite_class(name, test_file):
    names = load_suite(test_file).names()
    attrs = {}
    for i in range(1, len(names) + 1):
        case = names[i]
        method = _method_name(case)
        assert method not in attrs, f"two Lua cases map to {method}"
        attrs[method] = _make_test(test_file, case)
    return type(name, (SynchronousTestCase,), attrs)


SandboxLuaTests = _suite_class("SandboxLuaTests", LUA_DIR / "tests" / "sandbox.lua")


class LuaSourceTests(SynchronousTestCase):
    def test_lua_files_compile_as_lua_52_and_follow_trapos_style(self):
        """CraftOS's Lua 5.2: no integer division, bitwise operators, goto; no global unpack."""
        load = lua52.LuaRuntime().eval("load")
        files = sorted(LUA_DIR.rglob("*.lua"))
        self.assertTrue(files)
        for path in files:
            text = path.read_text()
            fn = load(text, "@" + str(path))
            err = None
            if isinstance(fn, tuple):
                fn, err = fn
            self.assertIsNotNone(fn, f"{path} does not compile as Lua 5.2: {err}")
            for line in text.splitlines():
                code = line.split("--", 1)[0]
                for token in ("loadstring(", "setfenv(", "getfenv("):
                    self.assertNotIn(token, code, f"{path}: {line.strip()}")
                self.assertIsNone(
                    re.search(r"(?<![\w.])unpack\(", code), f"{path}: global unpack: {line.strip()}"
                )
            self.assertTrue(text.startswith("local _VERSION = '"), f"{path}: _VERSION first")


class VersionTests(SynchronousTestCase):
    def test_every_lua_version_ccpm_and_the_package_agree(self):
        """One release: every Lua _VERSION, ccpm.json's version and trapsandbox.__version__."""

        versions = {"trapsandbox.__version__": trapsandbox.__version__}
        ccpm = LUA_DIR / "packages" / "trapos-sandbox" / "ccpm.json"
        versions[str(ccpm.relative_to(LUA_DIR))] = json.loads(ccpm.read_text())["version"]
        for path in sorted(LUA_DIR.rglob("*.lua")):
            match = re.match(r"local _VERSION = '([^']*)'\n", path.read_text())
            self.assertIsNotNone(match, f"{path}: no _VERSION on the first line")
            versions[str(path.relative_to(LUA_DIR))] = match.group(1)
        self.assertGreater(len(versions), 6)
        self.assertEqual(
            set(versions.values()), {trapsandbox.__version__}, f"versions disagree: {versions}"
        )
