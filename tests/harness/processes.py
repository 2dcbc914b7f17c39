"""Child processes for tests: started on the reactor, output watched, always stopped."""

from __future__ import annotations

import os
import re
import sys

from twisted.internet import protocol
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready

from tests.harness.support import bounded, closed_port, fast_paths, reactor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


class Child(protocol.ProcessProtocol):
    """A child process whose output (stdout and stderr) is kept and can be waited on."""

    def __init__(self) -> None:
        self.output = ""
        self.exit_code: int | None = None
        self.ended = False
        self._watchers: list[tuple[re.Pattern, Deferred]] = []
        self._end_waiters: list[Deferred] = []

    def outReceived(self, data: bytes) -> None:
        self.output += data.decode("utf-8", "replace")
        for watcher in list(self._watchers):
            match = watcher[0].search(self.output)
            if match:
                self._watchers.remove(watcher)
                watcher[1].callback(match)

    errReceived = outReceived

    def processEnded(self, reason) -> None:
        self.ended = True
        self.exit_code = 0 if reason.check(ProcessDone) else reason.value.exitCode
        watchers, self._watchers = self._watchers, []
        for _, d in watchers:
            d.errback(AssertionError(f"the process ended; its output:\n{self.output}"))
        waiters, self._end_waiters = self._end_waiters, []
        for d in waiters:
            d.callback(self.exit_code)

    def wait_for(self, pattern: str, seconds: float = 15) -> Deferred:
        """Fires with the first match of ``pattern`` in the output."""
        compiled = re.compile(pattern)
        match = compiled.search(self.output)
        if match:
            return succeed(match)
        if self.ended:
            raise AssertionError(f"the process ended; its output:\n{self.output}")
        d = Deferred()
        self._watchers.append((compiled, d))
        return bounded(d, seconds)

    async def listening_port(self, seconds: float = 15) -> int:
        """The port a gateway said it listens on (127.0.0.1)."""
        return int((await self.wait_for(r"listening on 127\.0\.0\.1:(\d+)", seconds)).group(1))

    def wait_ended(self, seconds: float = 10) -> Deferred:
        """Fires with the exit code."""
        if self.ended:
            return succeed(self.exit_code)
        d = Deferred()
        self._end_waiters.append(d)
        return bounded(d, seconds)

    def signal(self, name: str) -> None:
        try:
            self.transport.signalProcess(name)
        except ProcessExitedAlready:
            pass


def spawn(testcase, argv: list[str], env: dict[str, str], cwd: str | None = None) -> Child:
    """
    Start ``argv``; the test's cleanup stops it (TERM, then KILL) and waits
    for it.  A gateway it starts runs in the testcase's mode (``both_modes``).
    """
    if not fast_paths(testcase):
        env = {**env, "SANDBOX_FAST_PATHS": "0"}
    if cwd is None:
        cwd = os.path.abspath(testcase.mktemp())
        os.makedirs(cwd)
    child = Child()
    reactor().spawnProcess(child, argv[0], argv, env=env, path=cwd)

    async def stop():
        if child.ended:
            return
        child.signal("TERM")
        try:
            await child.wait_ended(5)
        except Exception:
            child.signal("KILL")
            await child.wait_ended(5)

    testcase.addCleanup(lambda: Deferred.fromCoroutine(stop()))
    return child


def spawn_gateway(
    testcase, *options: str, port: int | None = 0, cwd: str | None = None, **env: str
) -> Child:
    """
    ``twistd -n trapsandbox`` with ``options``, on 127.0.0.1:``port`` (0: a free one, see
    ``listening_port``; None: no ``--port``), its environment ``clean_env(**env)``.
    """
    argv = [TWISTD, "-n", "--pidfile=", "trapsandbox", *options]
    if port is not None:
        argv += ["--port", f"tcp:{port}:interface=127.0.0.1"]
    return spawn(testcase, argv, clean_env(**env), cwd)


def clean_env(**extra: str | None) -> dict[str, str]:
    """
    This process's environment without any trapsandbox or opencode setting, but for
    ``OPENCODE_URL``: an address nothing listens on, so a gateway runs no opencode of its
    own unless a test asks for that (``OPENCODE_URL=None`` leaves it unset); ``extra``
    added (None: removed).
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SANDBOX_", "OPENCODE_"))
    }
    # The child runs this tree's code, not whatever the shared venv installed.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    env["OPENCODE_URL"] = f"http://127.0.0.1:{closed_port()}"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
