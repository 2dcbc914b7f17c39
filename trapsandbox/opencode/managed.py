"""
opencode in the gateway's own care (issue 45): with ``OPENCODE_URL`` unset the
gateway runs ``opencode serve`` itself, ``SANDBOX_OPENCODE_SERVERS`` of them
(default 1), each used exactly as a URL of ``OPENCODE_URL`` would be.

Each server is one ``Managed``: on 127.0.0.1, a port picked when the gateway is
built (so its URL, and the ask machinery built on it, never change), a random
Basic-auth password made then (``OPENCODE_SERVER_PASSWORD`` in the child's
environment, never logged), as the gateway's own user and with its
environment (so the operator's opencode config and provider keys reach it),
plus ``MIMALLOC_PURGE_DELAY=0`` (docs/benchmarks.md: it gave back memory).

Its life, one state at a time (``figures()`` says which, for ``/health``)::

    failed      the program is not there: nothing is started; said once, at start
    starting    spawned, not yet listening ("listening on" in its output)
    ready       answering, and done with what a fresh process's first ask would wait for
                (``warming``: it loads its model providers)
    draining    past ``SANDBOX_OPENCODE_MAX_RSS_MB`` (looked at as each ask starts and ends): no
                new ask starts on it; once its running asks have ended (or
                ``OPENCODE_DRAIN_BOUND`` has passed) it is stopped and started again,
                "recycled"; one server at a time
    recycling   stopping (as below) to be started again at once, no delay
    restarting  it ended by itself: started again after a delay that doubles from
                1 s to 30 s while it keeps dying young, back to 1 s once it stayed
                up for 30 s; why (exit code or signal, its last lines) is kept
    stopping    the gateway stops: SIGTERM, then SIGKILL after a grace period
                (opencode 1.18.33 sometimes sits on SIGTERM for seconds)
    stopped

Its output goes to the gateway's log, each line prefixed with the server and cut
to ``MAX_LINE``, at most ``LINES_PER_INTERVAL`` lines an interval (the rest
counted in one line).  Nothing is left behind: the child is the gateway's
(under systemd, the unit's cgroup), and it is started through a few lines of
Python that ask the kernel to kill it if the gateway dies (``PR_SET_PDEATHSIG``)
before they become opencode, so a ``kill -9`` of twistd leaves no opencode.

While a server is not ready its probe answers with the reason at once
(``unready``), so ``/health`` and ``sandbox health`` say "the agent is
restarting" or "opencode will not start: …" instead of "connection refused".
"""

from __future__ import annotations

import enum
import os
import secrets
import shutil
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twisted.application import service
from twisted.internet import protocol
from twisted.internet.defer import Deferred, DeferredList, TimeoutError, fail, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import opencode_error

log = Logger()

# Run as the child: ask to be killed with the gateway, then become opencode.  Its first
# argument is the gateway's pid: a gateway that died before the prctl is not waited on.
SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
MAX_LINE = 300
LINES_PER_INTERVAL = 50
LAST_LINES = 5


class State(enum.Enum):
    FAILED = "failed"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    RECYCLING = "recycling"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"


def free_port() -> int:
    """A loopback port free now (the child binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_program(program: str | None) -> str | None:
    """``program`` (default: ``opencode`` on PATH, else the one ``make`` installs), as a path;
    None if it is not there."""
    if program:
        return shutil.which(program)
    found = shutil.which("opencode")
    if found is not None:
        return found
    installed = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        ".tools",
        "opencode",
        "node_modules",
        ".bin",
        "opencode",
    )
    return installed if os.access(installed, os.X_OK) else None


class _Child(protocol.ProcessProtocol):
    def __init__(self, managed: Managed) -> None:
        self._managed = managed
        self._partial = {1: b"", 2: b""}

    def childDataReceived(self, fd: int, data: bytes) -> None:
        lines = (self._partial.get(fd, b"") + data).split(b"\n")
        self._partial[fd] = lines.pop()[-4096:]
        for line in lines:
            self._managed.heard(line.rstrip(b"\r").decode("utf-8", "replace"))

    def processExited(self, reason: Failure) -> None:
        # Exited, not ended: a child of its own (a tool's process) may hold its pipes open.
        self._managed.ended(reason)


class Managed:
    """One ``opencode serve`` the gateway runs (see the module's docstring)."""

    def __init__(
        self,
        reactor: Any,
        name: str,
        program: str | None,
        port: int,
        password: str,
        environ: Mapping[str, str],
        *,
        grace: float = limits.OPENCODE_STOP_GRACE,
        spawn: Any = None,
    ) -> None:
        self._reactor = reactor
        self.name = name
        self.program = program
        self.port = port
        self.password = password
        self._environ = dict(environ)
        self._grace = grace
        self._spawn = spawn or reactor.spawnProcess
        # Whether it answers HTTP now (a Deferred): opencode says "listening on", and accepts
        # connections, a moment before it answers (NOTES-opencode: a request sent just then
        # can hang).  Set by ``servers.Server.build`` (a short health call); None: the line.
        self.answering: Callable[[], Deferred] | None = None
        # Then what the first ask on a fresh process would otherwise wait for, done before it
        # is ready (its result aside: a failure is the asks' to report); set by
        # ``servers.Server.build``; None: nothing.
        self.warming: Callable[[], Deferred] | None = None
        # How many of its instances the asks keep live (``instances``), for ``figures``; set by
        # ``servers.Server.build``.
        self.instances: Callable[[], int] | None = None
        self.state = State.STOPPED if program else State.FAILED
        self.process: Any = None
        self.restarts: dict[str, int] = {}
        self.why: str | None = None if program else "the opencode program was not found"
        self._delay = limits.OPENCODE_RESTART_MIN
        self._timer: IDelayedCall | None = None
        self._ready_at: float | None = None
        self._signalled_at: float | None = None  # when it was last told to stop (SIGTERM)
        self._last: deque[str] = deque(maxlen=LAST_LINES)
        self._window = (0.0, 0, 0)  # start, lines logged, lines dropped
        self._stopped: list[Deferred[None]] = []
        # Who waits for it to answer again (``when_ready``), and who is told it does.
        self._ready_waiters: list[Deferred[None]] = []
        self.on_ready: list[Any] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- what it is doing -------------------------------------------------------------------

    def unready(self) -> str | None:
        """Why its agent cannot answer now, in one line; None when it is ready."""
        if self.state is State.READY:
            return None
        if self.state is State.FAILED:
            return f"opencode will not start: {self.why}"
        if self.state is State.RESTARTING:
            return f"the agent is restarting ({self.why})"
        if self.state in (State.DRAINING, State.RECYCLING):
            return "the agent is restarting to give back its memory"
        if self.state is State.STARTING:
            return "the agent is starting" + (f" ({self.why})" if self.why else "")
        return "the agent is stopped"

    def figures(self) -> dict[str, Any]:
        """What ``/health`` and ``/metrics`` show of it."""
        figures: dict[str, Any] = {
            "name": self.name,
            "state": self.state.value,
            "restarts": dict(self.restarts),
        }
        if self.process is not None and self.process.pid is not None:
            figures["pid"] = self.process.pid
            rss = rss_bytes(self.process.pid)
            if rss is not None:
                figures["rssBytes"] = rss
        if self.instances is not None:
            figures["instances"] = self.instances()
        if self.state is not State.READY and self.why:
            figures["detail"] = self.why
        return figures

    # -- its life -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.state is State.FAILED:
            log.error(
                "{name}: {why}: set SANDBOX_OPENCODE_BIN, or OPENCODE_URL for an opencode "
                "run apart; the gateway serves without an agent meanwhile",
                name=self.name,
                why=self.why,
            )
            return
        if self.state not in (State.STOPPED, State.RESTARTING):
            return
        self._timer = None
        self.state = State.STARTING
        env = {
            **self._environ,
            "OPENCODE_SERVER_PASSWORD": self.password,
            "MIMALLOC_PURGE_DELAY": "0",
        }
        env.pop("OPENCODE_SERVER_USERNAME", None)
        argv = [
            sys.executable,
            "-c",
            SHIM,
            str(os.getpid()),
            self.program,
            "serve",
            "--hostname",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self._last.clear()
        self.process = self._spawn(_Child(self), sys.executable, argv, env=env)
        log.info(
            "{name}: started {program} (pid {pid}) on 127.0.0.1:{port}",
            name=self.name,
            program=self.program,
            pid=self.process.pid,
            port=self.port,
        )

    def heard(self, line: str) -> None:
        """One line of its output."""
        if not line.strip():
            return
        line = line[:MAX_LINE]
        self._last.append(line)
        if self.state is State.STARTING and "listening on" in line:
            self._confirm(self.process)
        self._log(line)

    def _confirm(self, process: Any, since: float | None = None) -> None:
        """Ready once it answers (``answering``, tried every 0.1 s while it runs); killed, and
        so started again, if it does not within ``OPENCODE_READY_WAIT``."""
        if since is None:
            since = self._reactor.seconds()

        def again(failure: Failure) -> None:
            if self.state is not State.STARTING or self.process is not process:
                return
            if self._reactor.seconds() - since < limits.OPENCODE_READY_WAIT:
                self._reactor.callLater(0.1, self._confirm, process, since)
                return
            self.why = (
                f"it listened but did not answer within {limits.OPENCODE_READY_WAIT:g} s "
                f"({failure.getErrorMessage()})"
            )
            log.warn("{name}: {why}: killing it", name=self.name, why=self.why)
            self._signal("KILL")

        if self.state is State.STARTING and self.process is process:
            if self.answering is None:
                self._ready(process)
                return
            self.answering().addCallbacks(lambda _: self._warm(process), again)

    def _warm(self, process: Any) -> None:
        """It answers: ready once ``warming`` is done, or ``OPENCODE_WARM_UP_WAIT`` passed."""
        if self.state is not State.STARTING or self.process is not process:
            return
        if self.warming is None:
            self._ready(process)
            return
        d = self.warming()
        d.addTimeout(limits.OPENCODE_WARM_UP_WAIT, self._reactor)
        d.addErrback(self._warm_failed)
        d.addBoth(lambda _: self._ready(process))

    def _warm_failed(self, failure: Failure) -> None:
        if failure.check(TimeoutError):
            why = f"still loading its model providers after {limits.OPENCODE_WARM_UP_WAIT:g} s"
        elif isinstance(failure.value, GatewayError):
            why = failure.value.message
        else:
            why = failure.getErrorMessage()
        log.warn("{name}: {why}", name=self.name, why=why)

    def _ready(self, process: Any) -> None:
        if self.state is not State.STARTING or self.process is not process:
            return
        self.state = State.READY
        self.why = None
        self._ready_at = self._reactor.seconds()
        log.info("{name}: ready", name=self.name)
        # Listeners first (the connections kept to the process before are dropped there),
        # then the asks that waited.
        for listener in list(self.on_ready):
            try:
                listener()
            except Exception:
                log.failure("{name}: a listener of its start failed", name=self.name)
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(None)

    def _log(self, line: str) -> None:
        now = self._reactor.seconds()
        start, logged, dropped = self._window
        if now - start >= limits.LOG_INTERVAL:
            if dropped:
                log.info(
                    "{name}: {dropped} lines of its output not logged",
                    name=self.name,
                    dropped=dropped,
                )
            start, logged, dropped = now, 0, 0
        if logged < LINES_PER_INTERVAL:
            log.info("{name}: {line}", name=self.name, line=line)
            logged += 1
        else:
            dropped += 1
        self._window = (start, logged, dropped)

    def ended(self, reason: Failure) -> None:
        """The child ended."""
        self.process = None
        if reason.check(ProcessDone):
            how, why = "exited", "it exited"
        elif reason.check(ProcessTerminated) and reason.value.signal is not None:
            how, why = "killed", f"it was killed by {signal_name(reason.value.signal)}"
        else:
            code = getattr(reason.value, "exitCode", None)
            how, why = "exited", f"it exited with code {code}"
        if self.state in (State.STOPPING, State.RECYCLING):
            recycled = self.state is State.RECYCLING
            self.state = State.STOPPED
            if self._signalled_at is not None:
                log.info(
                    "{name}: stopped {seconds:.1f} s after SIGTERM ({why})",
                    name=self.name,
                    why=why,
                    seconds=self._reactor.seconds() - self._signalled_at,
                )
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            if recycled:
                # Started again at once (its conversations are on its disk).
                self.restarts["recycled"] = self.restarts.get("recycled", 0) + 1
                self.why = "it was restarted to give back its memory"
                self.start()
                return
            stopped, self._stopped = self._stopped, []
            for d in stopped:
                d.callback(None)
            return
        if self._last:
            why += f": {self._last[-1]}"
        stable = self._ready_at is not None and (
            self._reactor.seconds() - self._ready_at >= limits.OPENCODE_STABLE_AFTER
        )
        if stable:
            self._delay = limits.OPENCODE_RESTART_MIN
        self.restarts[how] = self.restarts.get(how, 0) + 1
        self.why = why
        self._ready_at = None
        self.state = State.RESTARTING
        log.warn(
            "{name}: {why}; starting it again in {delay:g} s",
            name=self.name,
            why=why,
            delay=self._delay,
        )
        self._timer = self._reactor.callLater(self._delay, self.start)
        self._delay = min(self._delay * 2, limits.OPENCODE_RESTART_MAX)

    def when_ready(self) -> Deferred[None]:
        """Fires once it answers (at once if it does); fails at once if it cannot start."""
        if self.state is State.READY:
            return succeed(None)
        if self.state is State.FAILED:
            return fail(opencode_error(self.unready() or "opencode will not start"))
        d: Deferred[None] = Deferred(self._forget_waiter)
        self._ready_waiters.append(d)
        return d

    def _forget_waiter(self, d: Deferred[None]) -> None:
        if d in self._ready_waiters:
            self._ready_waiters.remove(d)

    @property
    def taking_asks(self) -> bool:
        """Whether a new ask may start on it now."""
        return self.state is State.READY

    def too_large(self, most: int | None) -> bool:
        """Whether it is past ``most`` bytes of memory (None: no bound)."""
        if most is None or self.state is not State.READY or self.process is None:
            return False
        rss = rss_bytes(self.process.pid)
        return rss is not None and rss > most

    def drain(self) -> None:
        """No new ask starts on it; ``recycle`` once its running asks have ended."""
        if self.state is State.READY:
            self.state = State.DRAINING
            log.info(
                "{name}: past its memory bound: draining, then starting it again",
                name=self.name,
            )

    def recycle(self) -> None:
        """Stopped and started again at once (it drained, or its drain's bound passed)."""
        if self.state in (State.READY, State.DRAINING) and self.process is not None:
            self._terminate(State.RECYCLING)

    def stop(self) -> Deferred[None]:
        """Stop it (SIGTERM, then SIGKILL past the grace period); fires once it has ended.
        Who waits for it to answer hears that it will not."""
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(opencode_error("the gateway is shutting down"))
        if self.process is None:
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            if self.state is not State.FAILED:
                self.state = State.STOPPED
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._stopped.append(d)
        if self.state is State.RECYCLING:
            self.state = State.STOPPING  # signalled already: not started again
        elif self.state is not State.STOPPING:
            self._terminate(State.STOPPING)
        return d

    def _terminate(self, state: State) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self.state = state
        self._signalled_at = self._reactor.seconds()
        self._signal("TERM")
        self._timer = self._reactor.callLater(self._grace, self._signal, "KILL")

    def _signal(self, name: str) -> None:
        if self.process is not None:
            try:
                self.process.signalProcess(name)
            except (OSError, ProcessExitedAlready):
                pass  # exited meanwhile: processExited is on its way


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class ManagedOpencode(service.Service):
    """Every opencode server the gateway runs: started and stopped with it."""

    def __init__(self, servers: Sequence[Managed]) -> None:
        self.servers = list(servers)

    @classmethod
    def build(
        cls, reactor: Any, count: int, program: str | None, environ: Mapping[str, str]
    ) -> ManagedOpencode:
        found = find_program(program)
        servers = [
            Managed(
                reactor,
                f"opencode[{n}]" if count > 1 else "opencode",
                found,
                free_port(),
                secrets.token_urlsafe(24),
                environ,
            )
            for n in range(1, count + 1)
        ]
        if found is None:
            for server in servers:
                server.why = (
                    f"{program!r} was not found on PATH"
                    if program
                    else "no opencode on PATH and none installed by make"
                )
        return cls(servers)

    def startService(self) -> None:
        super().startService()
        for server in self.servers:
            server.start()

    def stopService(self) -> Deferred:
        super().stopService()
        return DeferredList([server.stop() for server in self.servers], consumeErrors=True)

    def figures(self) -> list[dict[str, Any]]:
        return [server.figures() for server in self.servers]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
