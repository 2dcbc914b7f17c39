"""The real opencode server (npm package opencode-ai) for tests."""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile

import treq
from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import REPO, clean_env, spawn
from tests.harness.support import bounded, closed_port, reactor

OPENCODE = os.environ.get("OPENCODE_BIN") or os.path.join(
    REPO, ".tools", "opencode", "node_modules", ".bin", "opencode"
)


async def _answering(url: str, seconds: float = 30) -> None:
    """Wait until ``url`` answers HTTP at all: opencode accepts before it answers."""
    pool = HTTPConnectionPool(reactor(), persistent=False)
    deadline = reactor().seconds() + seconds
    while True:
        try:
            response = await bounded(treq.get(url, pool=pool), 2)
            await bounded(treq.content(response), 2)
            return
        except Exception:
            if reactor().seconds() > deadline:
                raise
            await deferLater(reactor(), 0.1, lambda: None)


# opencode offline: no models fetched, and no ``npm install @opencode-ai/plugin`` into a fresh
# config directory (where the registry answers, that install cost each start 5-8 CPU-s over
# its first ~10 s, and reached beyond this machine).
OFFLINE = {"OPENCODE_DISABLE_MODELS_FETCH": "1", "npm_config_offline": "true"}


def opencode_env(home: str, password: str, extra: dict[str, str] | None) -> dict[str, str]:
    """opencode's environment: a throwaway ``home`` for all it keeps, nothing fetched from
    the network (``OFFLINE``), Basic auth with ``password``, and ``extra``."""
    return clean_env(
        HOME=home,
        XDG_CONFIG_HOME=os.path.join(home, ".config"),
        XDG_DATA_HOME=os.path.join(home, ".local", "share"),
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
        XDG_STATE_HOME=os.path.join(home, ".local", "state"),
        OPENCODE_SERVER_PASSWORD=password,
        **OFFLINE,
        **(extra or {}),
    )


async def start_opencode(
    testcase,
    password: str,
    config: dict | None = None,
    env: dict[str, str] | None = None,
    global_config: bool = False,
    port: int | None = None,
    children: list | None = None,
) -> str:
    """
    ``opencode serve`` on a loopback port with a throwaway HOME; returns its URL.
    ``config`` is written as ``opencode.json`` in its working directory, or with
    ``global_config`` as its user config (``$XDG_CONFIG_HOME/opencode``), which
    every directory's instance reads; ``env`` is added to its environment;
    ``port`` (a free one) is where it listens, when its URL must be known first;
    ``children`` gets its process (to stop it mid-test).
    """
    if not os.path.exists(OPENCODE):
        testcase.fail(f"{OPENCODE} is missing: 'make test' installs it")
    home = os.path.abspath(testcase.mktemp())
    os.makedirs(home)
    env = opencode_env(home, password, env)
    if config is not None:
        where = os.path.join(home, ".config", "opencode") if global_config else home
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "opencode.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    port = port or closed_port()
    argv = [OPENCODE, "serve", "--port", str(port), "--hostname", "127.0.0.1"]
    child = spawn(testcase, argv, env, cwd=home)
    if children is not None:
        children.append(child)
    await child.wait_for(r"listening on", 30)
    url = f"http://127.0.0.1:{port}"
    await _answering(url + "/config")
    return url


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlives the tests


class SharedOpencode:
    """
    One ``opencode serve`` for the tests of a class (a start costs seconds of CPU), each test
    with its own scripted model and gateway on ports chosen once for the class
    (``model_port``, ``gateway_port``), so that the user config written at the first start
    stays true for every test.  A plain child process, not the reactor's (trial's janitor
    closes what a test leaves in the reactor), started by the first test that asks and stopped
    by the class's ``tearDownClass`` (``stop``), or by the kernel if the test run dies first.
    The tests of such a class go to one pytest-xdist worker (``--dist loadscope``).
    """

    def __init__(self, password: str, env: dict[str, str] | None = None) -> None:
        self.password = password
        self._env = env or {}
        self._ports: dict[str, int] = {}
        self._process: subprocess.Popen | None = None
        self._home: str | None = None

    def _port(self, name: str) -> int:
        if name not in self._ports:
            self._ports[name] = closed_port()
        return self._ports[name]

    @property
    def model_port(self) -> int:
        return self._port("model")

    @property
    def gateway_port(self) -> int:
        return self._port("gateway")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port('opencode')}"

    def serves(self, testcase) -> None:
        """``testcase`` uses it: call before its gateway starts, so that the connections
        between opencode and the test's gateway and model (kept alive, MCP and event streams,
        a call in flight) are closed once both have stopped, as opencode's exit closed them."""
        testcase.addCleanup(lambda: Deferred.fromCoroutine(self._hang_up()))

    async def _hang_up(self) -> None:
        ours = {self.gateway_port, self.model_port}
        opencode = self._port("opencode")
        for selectable in {*reactor().getReaders(), *reactor().getWriters()}:
            if (isinstance(selectable, tcp.Server) and selectable.getHost().port in ours) or (
                isinstance(selectable, tcp.Client) and selectable.getPeer().port == opencode
            ):
                selectable.abortConnection()
        # Their connectionLost, then what waited on them (a call's timeout cancelled).
        for _ in range(2):
            await deferLater(reactor(), 0, lambda: None)

    async def start(self, testcase, config: dict) -> str:
        """Its URL, once it answers; started with ``config`` as its user config if it is not
        running (a model or gateway it names is on ``model_port`` and ``gateway_port``: the
        config is written once for the class)."""
        if self._process is not None and self._process.poll() is None:
            return self.url
        if not os.path.exists(OPENCODE):
            testcase.fail(f"{OPENCODE} is missing: 'make test' installs it")
        self.stop()
        self._home = home = tempfile.mkdtemp(prefix="trapsandbox-shared-opencode-")
        where = os.path.join(home, ".config", "opencode")
        os.makedirs(where)
        with open(os.path.join(where, "opencode.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        env = opencode_env(home, self.password, self._env)
        argv = [OPENCODE, "serve", "--port", str(self._port("opencode")), "--hostname", "127.0.0.1"]
        with open(os.path.join(home, "opencode.log"), "wb") as log:
            self._process = subprocess.Popen(
                argv,
                env=env,
                cwd=home,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        await _answering(self.url + "/config", 60)
        return self.url

    def stop(self) -> None:
        """Killed and waited for; its files removed.  (Nothing of it is kept, so there is
        nothing for a SIGTERM to save: opencode 1.18.33 sometimes sits on one for seconds.)"""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None
