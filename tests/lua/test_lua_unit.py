"""Run the Lua unit tests in ``lua/tests/`` on real Lua 5.2, one test method per Lua case.

The methods are generated on trial ``SynchronousTestCase`` classes rather than parametrized
pytest functions: a plain pytest function would start pytest-twisted's reactor greenlet, and
the trial test cases that run after it could no longer run the reactor themselves.
"""

import json
import re
import shutil
from pathlib import Path

from lupa import lua52
from twisted.trial.unittest import SynchronousTestCase

import trapsandbox
from tests.harness.lua52 import libsandbox, load, runtime
from trapsandbox.web import client

LUA_DIR = Path(__file__).resolve().parents[2] / "lua"
SANDBOX_SUITE = LUA_DIR / "tests" / "sandbox.lua"
DATAPACK_SUITE = LUA_DIR / "tests" / "datapack.lua"


def load_suite(test_file):
    """A fresh Lua 5.2 runtime (without what CraftOS lacks) holding the suite in test_file:
    tests/sandbox.lua given libsandbox as the gateway serves it (built from its modules), a
    module's tests (tests/modules/NAME.lua) given the kit that loads modules one by one,
    tests/datapack.lua the kit, the data pack's loader as served, the modules it names and
    their sources."""
    lua = runtime()
    chunk = load(lua, test_file.read_bytes(), "@" + str(test_file))
    fakes = load(lua, (LUA_DIR / "tests" / "fakes.lua").read_bytes(), "@tests/fakes.lua")()
    if test_file == SANDBOX_SUITE:
        return chunk("--suite", libsandbox(lua), fakes)
    modules = LUA_DIR / "sandbox"

    def source(name):
        return (modules / f"{name}.lua").read_bytes()

    def load_module(name):
        # As the one-file build loads it: the module's own name and lines.
        return load(lua, source(name), f"@sandbox/{name}.lua")

    kit = load(lua, (LUA_DIR / "tests" / "kit.lua").read_bytes(), "@tests/kit.lua")()
    if test_file == DATAPACK_SUITE:
        names = lua.table_from(list(client.MODULES))
        return chunk(kit(load_module, fakes), client.pack_loader(), names, source)
    return chunk(kit(load_module, fakes))


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


SandboxLuaTests = _suite_class("SandboxLuaTests", SANDBOX_SUITE)
DatapackLoaderTests = _suite_class("DatapackLoaderTests", DATAPACK_SUITE)
# One class per module that has tests of its own (ModuleTests_core, ...).
for _path in sorted((LUA_DIR / "tests" / "modules").glob("*.lua")):
    globals()[f"ModuleTests_{_path.stem}"] = _suite_class(f"ModuleTests_{_path.stem}", _path)


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


class BuildTests(SynchronousTestCase):
    """The one-file libsandbox the gateway serves, built from lua/sandbox/ (client.py)."""

    def test_the_copy_in_the_tree_is_the_build(self):
        """lua/apis/libsandbox.lua (trapos's package takes it) is what the gateway serves:
        `python -m trapsandbox.web.client` writes it again after a module changed."""
        self.assertTrue(
            (LUA_DIR / client.LIBRARY).read_bytes() == client.build_libsandbox(),
            "lua/apis/libsandbox.lua is not the build of lua/sandbox/: "
            "run `python -m trapsandbox.web.client`",
        )

    def test_every_module_is_built_in_and_every_file_is_a_module(self):
        modules = {path.stem for path in (LUA_DIR / "sandbox").glob("*.lua")}
        self.assertEqual(modules, set(client.MODULES))
        built = client.build_libsandbox()
        for name in client.MODULES:
            self.assertIn(b"loadModule('" + name.encode() + b"', [", built)
        self.assertTrue(built.startswith(b"local _VERSION = '" + trapsandbox.__version__.encode()))

    def test_a_runtime_error_in_a_module_names_the_module_and_its_line(self):
        lua = runtime()
        lib = libsandbox(lua)()
        # sandbox/wire.lua's traposId checks its argument with cc.expect; the line that
        # raises is in the module, and the error and traceback name it, not the one file.
        wire = (LUA_DIR / "sandbox" / "wire.lua").read_text().splitlines()
        line = wire.index("  local id = osLike.getComputerID()") + 1
        ok, err = lua.eval("function(lib) return xpcall(lib.traposId, debug.traceback, {}) end")(
            lib
        )
        self.assertIs(ok, False)
        self.assertIn(f"sandbox/wire.lua:{line}: attempt to call field 'getComputerID'", err)
        self.assertIn(f"sandbox/wire.lua:{line}: in function", err)

    def test_a_module_that_does_not_compile_names_itself(self):
        root = Path(self.mktemp())
        shutil.copytree(LUA_DIR, root)
        broken = root / "sandbox" / "jobs.lua"
        broken.write_text(broken.read_text() + "this is not lua\n")
        lua = runtime()
        chunk = load(lua, client.build_libsandbox(root), "=libsandbox")
        ok, err = lua.eval("pcall")(chunk)
        self.assertIs(ok, False)
        line = len(broken.read_text().splitlines())
        self.assertIn(f"sandbox/jobs.lua:{line}:", err)

    def test_long_brackets_never_close_inside_the_source(self):
        self.assertEqual(client.long_bracket(b"x = 1\n"), (b"[[", b"]]"))
        self.assertEqual(client.long_bracket(b"t[a[1]]\n"), (b"[=[", b"]=]"))
        self.assertEqual(client.long_bracket(b"s = [==[ ]] ]=] ]==]\n"), (b"[===[", b"]===]"))
        self.assertEqual(client.long_bracket(b"s = a[1]"), (b"[=[", b"]=]"))
        root = Path(self.mktemp())
        shutil.copytree(LUA_DIR, root)
        odd = root / "sandbox" / "api.lua"
        odd.write_text(odd.read_text() + "M.BRACKETS = ']] ]=] ]==] ]===] [[x]]'\n")
        lua = runtime()
        lib = load(lua, client.build_libsandbox(root), "=libsandbox")()
        self.assertEqual(lib.BRACKETS, "]] ]=] ]==] ]===] [[x]]")
