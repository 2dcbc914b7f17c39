"""
One computer on CC:Tweaked's own core, for tests: the game as players run it.

``../shared/cctweaked/`` (beside the repository; ``TRAPSANDBOX_CCTWEAKED`` names another
folder) runs one computer on CC:Tweaked 1.113.1's core, headless: its Lua VM (Cobalt), its
Netty websockets and address rules, its enforced 1,000,000-byte disk, multishell on an
advanced computer. Its README says what it does; this module starts it as a child process of
the test (stopped at cleanup) and reads what it prints::

    computer = CCTComputer(self, id=7, label="lab")
    computer.install_client()                       # or let a startup.lua run the installer
    computer.set_settings({"sandbox.url": url, "sandbox.password": "pw"})
    computer.write_file("/startup.lua", "shell.run('/servers/sandbox.lua')")
    computer.boot()
    await computer.wait_for_screen("sandbox daemon")   # a row it printed, wraps tolerated

``CCTComputer(self, datapack=client.datapack(url))`` merges a data pack's files over the ROM
as a world with the pack in its ``datapacks/`` does.

The computer cannot be typed into: tests drive it through the gateway (exec, eval, files,
input) as the agent does, and read what the player would see from the rows it prints.

``unavailable()`` says why the computer cannot run here (no ``../shared``, no Java, a Debian
package missing): tests skip with that message.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

from twisted.internet import defer

from tests.harness.processes import Child, spawn
from tests.harness.support import bounded
from trapsandbox.computers.registry import Registry
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.web import client

REPO = Path(__file__).resolve().parents[2]
LUA = REPO / "lua"
# Where the installer puts each file the gateway serves (client.read: the library built from
# its modules, the others as they are in lua/).
CLIENT_FILES = {
    "/apis/libsandbox.lua": "apis/libsandbox.lua",
    "/servers/sandbox.lua": "servers/sandbox.lua",
    "/programs/sandbox.lua": "programs/sandbox.lua",
}
HOME = Path(os.environ.get("TRAPSANDBOX_CCTWEAKED") or REPO.parent / "shared" / "cctweaked")
RUN = HOME / "run-cct.sh"
# What run-cct.sh loads from Debian's packages (its README's apt-get line).
JARS = ("guava", "fastutil", "netty-codec-http", "netty-handler-proxy", "jzlib", "slf4j-simple")
PACKAGES = (
    "default-jre-headless libnetty-java libguava-java libfastutil-java libjzlib-java libslf4j-java"
)
DISK = 1_000_000  # CC:Tweaked's computer_space_limit, as shipped
# A test's computer lives seconds, not a server's hours: the JVM's quick compiler alone and one
# GC thread. A computer that boots, runs a 3-million-step Lua loop and shuts down took 5.5 CPU-s
# with the JVM's defaults and 1.8 with these, its loop 2.6 s and 0.7 s (two busy cores: C2's
# compiler threads compete with the computer's own). Benchmarks keep the defaults.
JVM_FOR_TESTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"


def unavailable() -> str | None:
    """Why a CC:Tweaked computer cannot run here, or None."""
    if not RUN.exists():
        return (
            f"CC:Tweaked's core is not here ({HOME}): these tests need ../shared/cctweaked "
            "beside the repository (or TRAPSANDBOX_CCTWEAKED)"
        )
    if shutil.which("java") is None:
        return f"java is missing: apt-get install {PACKAGES} (make test does)"
    missing = [j for j in JARS if not Path(f"/usr/share/java/{j}.jar").exists()]
    if missing:
        return f"Debian's {', '.join(missing)} jars are missing: apt-get install {PACKAGES}"
    return None


def lua_literal(value: Any) -> str:
    """``value`` as a Lua literal (what ``textutils.unserialize`` reads back)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return (
            '"'
            + "".join(c if c.isalnum() or c in " ._:/-,=" else f"\\{ord(c)}" for c in value)
            + '"'
        )
    if isinstance(value, dict):
        return (
            "{"
            + "".join(f"[{lua_literal(k)}] = {lua_literal(v)}, " for k, v in value.items())
            + "}"
        )
    raise TypeError(f"no Lua literal for {value!r}")


#: Multishell's tab bar as a row of its own: each tab's title with a space before it.
TAB_BAR_ROW = r"(?:\n(?: [\w.-]+ ?)+(?=\n))?"


def on_screen(text: str) -> str:
    """
    A pattern for ``text`` as the computer prints it: rows of 51 columns, so a line may be cut
    anywhere (a word too long) or at a space (CraftOS's word wrap, the space dropped). Rows are
    printed as they settle, so multishell's tab bar (" shell  sandbox"), redrawn when a tab's
    title changes, may come between two rows of one message.
    """
    cut = TAB_BAR_ROW + r"\n?"
    parts = []
    for char in text:
        parts.append(TAB_BAR_ROW + r"\s+" if char == " " else re.escape(char) + cut)
    return "".join(parts)


class CCTComputer:
    """
    An advanced computer (``basic=True``: a normal one) with CC:Tweaked's default settings,
    its files in the test's own folder; http rules as shipped (``$private`` denied) with an
    allow rule in front for each of ``allow_hosts``, as a server admin adds.
    """

    def __init__(
        self,
        testcase,
        id: int = 7,
        label: str | None = None,
        allow_hosts: tuple[str, ...] = ("127.0.0.1",),
        disk_limit: int | None = None,
        basic: bool = False,
        settings: str | None = None,
        datapack: bytes | None = None,
        jvm: str = JVM_FOR_TESTS,
    ) -> None:
        self._testcase = testcase
        self.jvm = jvm
        self.id = id
        self.label = label
        self.allow_hosts = allow_hosts
        self.disk_limit = disk_limit
        self.basic = basic
        self.settings = settings
        self.data = Path(os.path.abspath(testcase.mktemp()))
        self.root = self.data / "computer" / str(id)
        self.root.mkdir(parents=True)
        self.child: Child | None = None
        self.rom = merge_datapack(self.data / "resources", datapack) if datapack else None

    @property
    def trapos_id(self) -> str:
        return f"{self.id}:{self.label or ''}"

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def write_file(self, path: str, content: str | bytes) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)

    def read_file(self, path: str) -> bytes | None:
        target = self.path(path)
        return target.read_bytes() if target.is_file() else None

    def install_client(self) -> None:
        """The client's files where the installer puts them (no startup entry)."""
        for dest, source in CLIENT_FILES.items():
            self.write_file(dest, client.read(source))

    def set_settings(self, values: dict[str, Any]) -> None:
        """``/.settings`` as ``settings.save`` writes it (None leaves a setting out)."""
        kept = {key: value for key, value in values.items() if value is not None}
        self.write_file("/.settings", lua_literal(kept))

    def boot(self, seconds: float = 300) -> Child:
        """Starts the computer; it shuts down after ``seconds`` (or when the test ends)."""
        argv = [str(RUN), "-d", str(self.data), "-i", str(self.id), "-t", str(seconds)]
        if self.label:
            argv += ["-l", self.label]
        for host in self.allow_hosts:
            argv += ["--allow-host", host]
        if self.disk_limit is not None:
            argv += ["--disk-limit", str(self.disk_limit)]
        if self.basic:
            argv.append("--basic")
        if self.settings:
            argv += ["--settings", self.settings]
        if self.rom:
            argv += ["--rom", str(self.rom)]
        env = {key: value for key, value in os.environ.items() if not key.startswith("SANDBOX_")}
        if self.jvm:
            env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} {self.jvm}".strip()
        self.child = spawn(self._testcase, argv, env)
        return self.child

    @property
    def output(self) -> str:
        return self.child.output if self.child else ""

    def wait_for_screen(self, text: str, seconds: float = 60):
        """Fires with the match once the computer has printed ``text`` (see ``on_screen``)."""
        assert self.child is not None, "boot() first"

        def missing(failure):
            failure.trap(defer.TimeoutError)
            raise AssertionError(
                f"{text!r} not printed in {seconds} s; the computer printed:\n{self.output}"
            )

        return self.child.wait_for(on_screen(text), seconds).addErrback(missing)

    async def shutdown(self) -> None:
        """Stops the computer (as the server stopping) and waits for it."""
        if self.child and not self.child.ended:
            self.child.signal("TERM")
            await self.child.wait_ended(15)


def merge_datapack(resources: Path, datapack: bytes) -> Path:
    """
    CC:Tweaked's resources (``HOME/rom``: ``data/computercraft/lua``) with ``datapack``'s files
    merged over them, as the game merges a data pack: its ``data/`` files are added, one of the
    same name replaces the mod's. Returns the folder to pass as ``--rom``.
    """
    shutil.copytree(HOME / "rom", resources)
    with zipfile.ZipFile(io.BytesIO(datapack)) as pack:
        for name in pack.namelist():
            if name.startswith("data/") and not name.endswith("/"):
                target = resources / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(pack.read(name))
    return resources


def _until(registry: Registry, done, seconds: float) -> defer.Deferred:
    """Fires with ``done()`` once it is not None, looked at on each change of the listing."""
    found = done()
    if found is not None:
        return defer.succeed(found)
    d: defer.Deferred = defer.Deferred()

    def changed() -> None:
        found = done()
        if found is not None and not d.called:
            d.callback(found)

    stop = registry.watch(changed)
    d.addBoth(lambda result: (stop(), result)[1])
    return bounded(d, seconds)


def wait_connected(registry: Registry, trapos_id: str, seconds: float = 60) -> defer.Deferred:
    """Fires with the session once ``trapos_id`` is connected to this gateway."""
    return _until(registry, lambda: registry.find(LOCAL_ACCOUNT, trapos_id), seconds)


def wait_gone(registry: Registry, trapos_id: str, seconds: float = 60) -> defer.Deferred:
    """Fires once the session of ``trapos_id`` connected now (if any) has left this gateway."""
    session = registry.find(LOCAL_ACCOUNT, trapos_id)
    if session is None:
        return defer.succeed(True)
    return _until(
        registry,
        lambda: True if registry.find(LOCAL_ACCOUNT, trapos_id) is not session else None,
        seconds,
    )
