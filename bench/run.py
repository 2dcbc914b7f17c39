"""
The benchmark's driver: start the servers and the generator, collect, report.

For each scenario it starts a fresh server (so memory figures do not inherit
another scenario's high-water mark), first the bare Autobahn echo server
(:mod:`bench.bare`) and then the real gateway (``twistd -n --pidfile=
trapsandbox``), each pinned to one CPU, and runs the generator
(:mod:`bench.load`) pinned to another CPU, beside the fake opencode.  Servers
and fake bind 127.0.0.1 only; every child is stopped at the end (and dies with
this process: ``PR_SET_PDEATHSIG``).  ``--quick`` runs every scenario tiny, on
one server per target, in a few seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from bench import proc, profile, report
from trapsandbox.limits import AUTO_PING_INTERVAL

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# twistd and the bare server say "listening on ADDR:PORT"; the Node peer (pino)
# "Server listening at http://ADDR:PORT".
LISTENING = re.compile(r"listening (?:on|at) (?:http://)?127\.0\.0\.1:(\d+)")
SECRET = "bench-secret"
ADMIN_TOKEN = "bench-admin-token"
# A larger listen backlog than Twisted's default of 50: the connect scenario
# opens up to 100 connections at once; both servers get the same.
BACKLOG = 1024

FULL: dict[str, dict[str, Any]] = {
    "connect": {"computers": 2000, "concurrency": 100},
    # The idle window is one auto-ping interval, so every connection's
    # ping and pong falls inside it exactly once.
    "idle": {"steps": [1000, 5000, 10000], "window": AUTO_PING_INTERVAL, "concurrency": 100},
    "health": {"computers": 100, "in_flight": 4, "duration": 10.0, "warmup": 1.0},
    "burst": {"computers": 1000},
    "ping": {"computers": 50, "concurrency": 32, "duration": 10.0},
    # ping's load over the operator WebSocket: one /operator socket per client.
    "opws": {"computers": 50, "concurrency": 32, "duration": 10.0},
    "churn": {"cycles": 20000, "concurrency": 32, "checkpoint": 1000, "max_seconds": 90.0},
    "slowreader": {
        "computers": 20,
        "in_flight": 2,
        "senders": 64,
        "request_bytes": 65536,
        "duration": 10.0,
    },
}
QUICK: dict[str, dict[str, Any]] = {
    "connect": {"computers": 20, "concurrency": 10},
    "idle": {"steps": [10, 50], "window": 0.5, "concurrency": 25},
    "health": {"computers": 5, "in_flight": 2, "duration": 0.5, "warmup": 0.2},
    "burst": {"computers": 20},
    "ping": {"computers": 5, "concurrency": 4, "duration": 0.5},
    "opws": {"computers": 5, "concurrency": 4, "duration": 0.5},
    "churn": {"cycles": 100, "concurrency": 8, "checkpoint": 20, "max_seconds": 10.0},
    "slowreader": {
        "computers": 3,
        "in_flight": 1,
        "senders": 2,
        "request_bytes": 65536,
        "duration": 0.5,
    },
}
SCENARIOS = tuple(FULL)
TARGETS = ("bare", "gateway", "gateway-plain")
# ``gateway-without-PART[+PART]``: the gateway with some fast paths left out
# (``SANDBOX_FAST_PATHS_WITHOUT``), to attribute a gain against gateway-plain.
WITHOUT = "gateway-without-"
# Optional sides, given with --peer NAME=PATH.
PEERS = ("fastify",)
# Scenarios that mean nothing against an echo server.
GATEWAY_ONLY = {"ping", "opws", "slowreader"}


def _bound(params: dict[str, Any]) -> float:
    """An upper bound on a scenario's run time, for the generator's timeout."""
    return 60 + params.get("window", 0) + params.get("duration", 0) + params.get("max_seconds", 0)


class Child:
    """A child process whose output goes to a log file, watched for ``listening on``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        cpu: int | None,
        env=None,
        cwd=None,
        marks: re.Pattern[str] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.port: int | None = None
        # The lines matching ``marks``, each with the time.monotonic() it was read at.
        self._marks = marks
        self.marked: list[tuple[float, str]] = []
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd or log.parent,
            preexec_fn=proc.child_setup(cpu),
        )
        self.pid = self.process.pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log, "wb") as out:
            for line in self.process.stdout:
                out.write(line)
                if self._marks is None and self.port is not None:
                    continue
                text = line.decode("utf-8", "replace")
                if self._marks is not None and self._marks.search(text):
                    self.marked.append((time.monotonic(), text.rstrip("\n")))
                if self.port is None:
                    match = LISTENING.search(text)
                    if match:
                        self.port = int(match.group(1))
                        self._listening.set()
            out.flush()
        self._listening.set()

    def wait_listening(self, seconds: float = 30) -> int:
        self._listening.wait(seconds)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"{self.name} did not start; see {self.log}:\n{self.tail()}")
        return self.port

    def stop(self, seconds: float = 15) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)
        return self.process.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def errors(self) -> list[str]:
        """Lines of the log that show a failure (tracebacks, unhandled errors)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [
            line
            for line in text.splitlines()
            if "Traceback" in line or "Unhandled" in line or "[-] Error" in line
        ]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SANDBOX_", "OPENCODE_"))
    }
    env.update(extra)
    return env


def _with_repo_path() -> dict[str, str]:
    """This tree first on ``PYTHONPATH`` (``-m bench.*`` from any directory)."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return _clean_env(PYTHONPATH=os.pathsep.join(paths))


def _cpus() -> tuple[int | None, int | None]:
    """The server's CPU and the generator's: two different ones when there are two."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return available[0], available[1]


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages = {}
    for name in (
        "trapsandbox",
        "Twisted",
        "autobahn",
        "txaio",
        "klein",
        "treq",
        "attrs",
        "cattrs",
        "orjson",
        "picows",
        "uvloop",
    ):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    try:
        from autobahn.websocket import USES_NVX
    except ImportError:
        USES_NVX = None
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": packages,
        "autobahn_nvx": USES_NVX,
        "load_average_at_start": os.getloadavg(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Load benchmark of the trapsandbox gateway against a bare Autobahn server.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny scenarios (a few computers, ~1 s each)"
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--targets",
        default="gateway,bare",
        help="from bare, gateway, gateway-plain (--plain: no fast paths), "
        "gateway-without-PART[+PART] (PART from front, fasthttp, frames, patches); "
        "default gateway,bare",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SCENARIO.PARAM=VALUE",
        help="override a parameter, e.g. --set health.duration=5 --set idle.steps=1000,5000",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="fastify=PATH",
        help="also run every scenario against the Node/Fastify build of the same design in "
        "PATH (its folder; npm ci is run there when node_modules is missing); skipped with "
        "a note when PATH does not exist",
    )
    parser.add_argument("--output", help="the JSON file (default: bench-results/bench-TIME.json)")
    parser.add_argument(
        "--fake-delay-ms", type=float, default=0.0, help="hold each fake opencode answer"
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="record the gateway with py-spy during each scenario (raw stacks in DIR; "
        "figures of a profiled run are perturbed)",
    )
    return parser.parse_args(argv)


def _plan(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    base = QUICK if args.quick else FULL
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    for name in names:
        if name not in base:
            raise SystemExit(f"bench: unknown scenario {name!r}; choose from {', '.join(base)}")
    plan = {name: dict(base[name]) for name in names}
    for override in args.set:
        key, _, value = override.partition("=")
        scenario, _, param = key.partition(".")
        if scenario not in plan or param not in plan[scenario]:
            raise SystemExit(f"bench: --set {override!r}: no such scenario parameter")
        current = plan[scenario][param]
        if isinstance(current, list):
            plan[scenario][param] = [int(v) for v in value.split(",")]
        else:
            plan[scenario][param] = type(current)(value)
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = _plan(args)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for target in targets:
        if target not in TARGETS and not target.startswith(WITHOUT):
            raise SystemExit(f"bench: unknown target {target!r}")
    peers, peer_notes = _peers(args.peer)
    targets += list(peers)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output = Path(
        args.output
        or REPO / "bench-results" / f"bench-{stamp}{'-quick' if args.quick else ''}.json"
    )
    logs = output.with_name(output.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    server_cpu, generator_cpu = _cpus()
    # SIGTERM (e.g. from a test's cleanup) unwinds through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    # One server per scenario, bare then gateway, so the two see the same
    # machine noise; --quick runs all scenarios on one server per target.
    if args.quick:
        runs = [(t, [n for n in plan if t != "bare" or n not in GATEWAY_ONLY]) for t in targets]
    else:
        runs = [(t, [n]) for n in plan for t in targets if t != "bare" or n not in GATEWAY_ONLY]
    runs = [(t, names) for t, names in runs if names]

    results: dict[str, dict[str, Any]] = {t: {} for t in targets}
    server_errors: dict[str, list[str]] = {}
    started = time.monotonic()
    children: list[Child] = []
    fake = None
    try:
        if set(targets) - {"bare"}:
            fake = Child(
                "fake opencode",
                [sys.executable, "-m", "bench.fakeopencode", "--port", "0"]
                + ["--delay-ms", str(args.fake_delay_ms)],
                logs / "fake-opencode.log",
                generator_cpu,
                env=_with_repo_path(),
            )
            children.append(fake)
            fake.wait_listening()
        for target, names in runs:
            label = f"{target}-{'-'.join(names) if len(names) < 3 else 'all'}"
            server = _start_server(target, label, logs, server_cpu, fake, peers.get(target))
            children.append(server)
            port = server.wait_listening()
            print(
                f"bench: {target} (pid {server.pid}, port {port}): {', '.join(names)}",
                file=sys.stderr,
                flush=True,
            )
            spy = (
                start_py_spy(args.py_spy, label, server, generator_cpu)
                if target.startswith("gateway")
                else None
            )
            spec = {
                "target": target,
                "url": f"ws://127.0.0.1:{port}/gateway",
                "address": f"127.0.0.1:{port}",
                "server_pid": server.pid,
                "fake_pid": fake.pid if fake and target != "bare" else None,
                "fake_port": fake.port if fake and target != "bare" else None,
                "secret": SECRET,
                "admin_token": ADMIN_TOKEN,
                "scenarios": [{"name": n, **plan[n]} for n in names],
            }
            outcome = _run_generator(spec, generator_cpu, sum(_bound(plan[n]) for n in names))
            if spy is not None:
                stop_py_spy(spy, args.py_spy, label)
            died = server.process.poll()
            code = server.stop()
            children.remove(server)
            errors = server.errors()
            if errors:
                server_errors[label] = errors[:20]
            for name in names:
                figures = outcome.get("scenarios", {}).get(name) or {
                    "failed": outcome.get("failed", "no result")
                }
                figures["server_exit_code"] = code
                if died is not None:
                    figures["failed"] = f"the server died during the run (exit code {died})"
                results[target][name] = figures
    finally:
        for child in children:
            child.stop()

    document = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "machine": machine(),
        "pinning": {"server_cpu": server_cpu, "generator_and_fake_opencode_cpu": generator_cpu},
        "fd_limit": proc.raise_fd_limit(),
        "listen_backlog": BACKLOG,
        "fake_opencode_delay_ms": args.fake_delay_ms,
        "parameters": plan,
        "results": results,
        "server_log_errors": server_errors,
        "peer_notes": peer_notes,
        "runtime_s": round(time.monotonic() - started, 1),
    }
    if args.py_spy:
        document["profiled"] = True
    document["ratios"] = report.ratios(results)
    document["targets"] = report.targets(results, quick=args.quick)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(report.table(document))
    print(f"\nfigures: {output}\nserver logs: {logs}")
    return 0


def _peers(given: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The peers to run (name -> folder, installed), and a note for each one skipped."""
    peers, notes = {}, []
    for entry in given:
        name, _, path = entry.partition("=")
        if name not in PEERS or not path:
            raise SystemExit(f"bench: --peer {entry!r}: give {' or '.join(PEERS)}=PATH")
        folder = Path(path).expanduser().resolve()
        if not (folder / "server.js").exists():
            notes.append(f"{name}: skipped, no server.js in {folder}")
            continue
        if not (folder / "node_modules").is_dir():
            done = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=folder,
                stdin=subprocess.DEVNULL,
                capture_output=True,
            )
            if done.returncode != 0:
                notes.append(f"{name}: skipped, npm ci failed: {done.stderr.decode()[-300:]}")
                continue
        peers[name] = folder
    for note in notes:
        print(f"bench: {note}", file=sys.stderr)
    return peers, notes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(
    target: str,
    label: str,
    logs: Path,
    cpu: int | None,
    fake: Child | None,
    folder: Path | None = None,
):
    endpoint = f"tcp:0:interface=127.0.0.1:backlog={BACKLOG}"
    opencode = f"http://127.0.0.1:{fake.port}" if fake else ""
    if target == "fastify":
        env = _clean_env(
            SANDBOX_HOST="127.0.0.1",
            SANDBOX_PORT=str(_free_port()),
            SANDBOX_PASSWORD=SECRET,
            OPENCODE_URL=opencode,
        )
        return Child(target, ["node", "server.js"], logs / f"{label}.log", cpu, env=env, cwd=folder)
    if target == "bare":
        argv = [sys.executable, "-m", "bench.bare", "--port", endpoint]
        env = _with_repo_path()
    else:
        argv = [str(BIN / "twistd"), "-n", "--pidfile=", "trapsandbox", "--port", endpoint]
        if target == "gateway-plain":
            argv.append("--plain")
        # This tree's code, not whatever the venv has installed (as for bare).
        env = _with_repo_path()
        env.update(SANDBOX_PASSWORD=SECRET, SANDBOX_ADMIN_TOKEN=ADMIN_TOKEN, OPENCODE_URL=opencode)
        if target.startswith(WITHOUT):
            env["SANDBOX_FAST_PATHS_WITHOUT"] = target[len(WITHOUT) :].replace("+", ",")
    return Child(target, argv, logs / f"{label}.log", cpu, env=env)


def _run_generator(spec: dict[str, Any], cpu: int | None, bound: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.load", orjson.dumps(spec).decode()]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            cwd=REPO,
            timeout=bound,
            preexec_fn=proc.child_setup(cpu),
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"the generator ran over its bound of {bound:.0f} s"}
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"failed": f"the generator exited {done.returncode}"}
    return orjson.loads(lines[-1])


def start_py_spy(directory: str | None, label: str, server: Child, cpu: int | None):
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    argv = [
        str(BIN / "py-spy"),
        "record",
        "--pid",
        str(server.pid),
        "--rate",
        os.environ.get("BENCH_PY_SPY_RATE", "250"),
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(Path(directory) / f"{label}.txt"),
    ]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=proc.child_setup(cpu),
    )


def stop_py_spy(spy: subprocess.Popen, directory: str, label: str) -> None:
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(5)
    stacks = Path(directory) / f"{label}.txt"
    if stacks.exists():
        # (A frame's name may hold bytes that are not UTF-8: py-spy writes them as they are.)
        summary = profile.summarize(stacks.read_text(errors="replace"))
        (Path(directory) / f"{label}-summary.txt").write_text(summary)
        print(summary, file=sys.stderr)
