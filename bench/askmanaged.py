"""
``sandbox ask`` for a whole server with opencode in the gateway's care (issue 45): the
real ``twistd trapsandbox`` with ``OPENCODE_URL`` unset runs the real ``opencode serve``
itself (its agent the scripted model of ``bench.ask``), recycling it past
``SANDBOX_OPENCODE_MAX_RSS_MB``.

    python -m bench.askmanaged [--computers 10,100,300] [--max-rss-mb MB] [--output FILE]

For each N, a fresh gateway: one computer asks first (opencode's first prompt of all
loads its machinery), then **round 1** (N computers ask at once: a new session and
instance each), **round 2** (they ask again), then, once opencode is ready again (a
round's last asks may leave it draining or restarting), **idle**: 10 new computers ask one
after another with nothing else running (a new computer's first text at that N: a
fresh opencode must not slow down with the instances it has made).

Watched while it runs, at no cost to the gateway: opencode's RSS every 0.25 s from
``/proc`` (the gateway's child), and the gateway's log lines as they arrive (each
drain, start and ready of its opencode, timestamped).  Figures per round: failed
asks, first text p50 / p99, gateway CPU per ask; per N: opencode's peak RSS, the
longest it stayed above the bound plus one instance, the recycles, each one's drain
(its "draining" line to its next start) and restart (start to ready), and the
longest any ask waited for a recycle (told "your ask waits for it" to its first
text).  The gateway's own settings are its defaults but for the per-account bounds
(every computer here is in one account).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from twisted.internet import defer, task, threads

from bench import harness, proc
from bench.ask import (
    BIN,
    IDLE_ASKS,
    OPENCODE,
    UNBOUNDED,
    _answering,
    _mib,
    ask_all,
    computers,
    one_at_a_time,
    scripted_model,
    summary,
)
from bench.run import (
    ADMIN_TOKEN,
    SECRET,
    Child,
    _free_port,
    _with_repo_path,
    start_py_spy,
    stop_py_spy,
)
from tests.harness.fake_model import FakeModel
from trapsandbox import limits
from trapsandbox.ops import ctl

# What one more instance costs opencode 1.18.33 here (docs/benchmarks.md: 52-74 MiB).
ONE_INSTANCE = 70 * 2**20
SAMPLE_EVERY = 0.25
# The gateway's log lines of its opencode's life (``managed``).
STOPPED = re.compile(r"opencode: stopped ([0-9.]+) s after SIGTERM")
MARKS = re.compile(r"opencode: (past its memory bound|started |ready|stopped )")


class Watched:
    """A gateway running opencode, watched: opencode's RSS over time, its life's log lines."""

    def __init__(
        self,
        logs: Path,
        label: str,
        model: FakeModel,
        max_rss_mb: int | None,
        settings: dict[str, str] | None = None,
    ):
        self.port = _free_port()
        self.state = tempfile.mkdtemp(prefix="trapsandbox-bench-askmanaged-")
        home = Path(self.state) / "home"
        where = home / ".config" / "opencode"
        where.mkdir(parents=True)
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(f"http://127.0.0.1:{self.port}", True),
        }
        (where / "opencode.json").write_text(json.dumps(config))
        env = _with_repo_path()
        for name in list(env):
            if name.startswith("OPENCODE_"):
                del env[name]  # OPENCODE_URL unset: the gateway runs its own
        env.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_DATA_HOME=str(home / ".local" / "share"),
            XDG_CACHE_HOME=str(home / ".cache"),
            XDG_STATE_HOME=str(home / ".local" / "state"),
            OPENCODE_DISABLE_MODELS_FETCH="1",
            SANDBOX_OPENCODE_BIN=str(OPENCODE),
            SANDBOX_PASSWORD=SECRET,
            SANDBOX_ADMIN_TOKEN=ADMIN_TOKEN,
            SANDBOX_STATE_DIR=self.state,
            SANDBOX_ASK_MAX_RUNNING_PER_ACCOUNT=str(UNBOUNDED),
            SANDBOX_MAX_ASK_CONVERSATIONS=str(UNBOUNDED),
        )
        self.bound = (max_rss_mb or limits.OPENCODE_MAX_RSS_MB) * 2**20
        if max_rss_mb:
            env["SANDBOX_OPENCODE_MAX_RSS_MB"] = str(max_rss_mb)
        env.update(settings or {})
        argv = [str(BIN / "twistd"), "-n", "--pidfile=", "trapsandbox"]
        argv += ["--port", f"tcp:{self.port}:interface=127.0.0.1:backlog=1024"]
        log = logs / f"{label}-gateway.log"
        self.gateway = Child("gateway", argv, log, None, env=env, marks=MARKS)
        self.rss: list[tuple[float, int]] = []  # (time.monotonic(), opencode's RSS)
        self._sampler = task.LoopingCall(self._sample)

    async def start(self, reactor) -> None:
        await threads.deferToThread(self.gateway.wait_listening, 60)
        await _answering(reactor, self.port, "/health", None)
        while not any("ready" in line for _, line in self.gateway.marked):
            await task.deferLater(reactor, 0.1, lambda: None)
        self._sampler.start(SAMPLE_EVERY)

    async def settled(self, reactor, bound: float = limits.OPENCODE_READY_WAIT) -> None:
        """
        Until opencode is ready and neither draining nor restarting: a round's last asks
        may leave it past its bound, and the idle round is of asks with nothing else
        running, a recycle included.
        """
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            life = [line for _, line in self.gateway.marked if "stopped " not in line]
            if life and life[-1].rstrip().endswith("opencode: ready"):
                return
            await task.deferLater(reactor, 0.1, lambda: None)
        raise RuntimeError(f"opencode was not ready again within {bound:g} s")

    def opencode_pid(self) -> int | None:
        """The gateway's child: opencode (the shim it starts through becomes it)."""
        try:
            with open(f"/proc/{self.gateway.pid}/task/{self.gateway.pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def _sample(self) -> None:
        pid = self.opencode_pid()
        if pid is not None:
            try:
                self.rss.append((time.monotonic(), proc.rss_bytes(pid)))
            except (OSError, IndexError):
                pass  # between a recycle's stop and its start

    def opencode_rss_mib(self) -> float | None:
        return _mib(self.rss[-1][1]) if self.rss else None

    def stop(self) -> None:
        """The gateway stopped (its opencode with it), and what they kept removed."""
        if self._sampler.running:
            self._sampler.stop()
        self.gateway.stop()
        shutil.rmtree(self.state, ignore_errors=True)

    def life(self) -> dict[str, Any]:
        """Recycles, their drains and restarts, the RSS peak and the time above the bound."""
        drains, restarts, stops = [], [], []
        drained_at = started_at = None
        for at, line in self.gateway.marked:
            stopped = STOPPED.search(line)
            if stopped:
                stops.append(float(stopped.group(1)))
            elif "past its memory bound" in line:
                drained_at = at
            elif "started " in line:
                if drained_at is not None:
                    drains.append(at - drained_at)
                drained_at, started_at = None, at
            elif "ready" in line and started_at is not None:
                restarts.append(at - started_at)
                started_at = None
        above, longest, since = self.bound + ONE_INSTANCE, 0.0, None
        for at, rss in self.rss:
            if rss > above and since is None:
                since = at
            elif rss <= above and since is not None:
                longest, since = max(longest, at - since), None
        if since is not None:
            longest = max(longest, self.rss[-1][0] - since)
        return {
            "bound_mib": _mib(self.bound),
            "opencode_rss_peak_mib": _mib(max((rss for _, rss in self.rss), default=0)),
            "seconds_above_bound_plus_one_instance": round(longest, 2),
            "recycles": len(drains),
            "drain_seconds_max": round(max(drains, default=0), 2),
            # Of each drain, from SIGTERM to its end (the rest: the asks running there ending).
            "stop_seconds": stops,
            # The first start is the gateway's own, not a restart.
            "restart_seconds": [round(s, 2) for s in restarts[1:]],
            # For a closer look (seconds from the first sample): each RSS sample, each line.
            "timeline": self._timeline(),
        }

    def _timeline(self) -> dict[str, list]:
        zero = self.rss[0][0] if self.rss else 0.0
        return {
            "rss_mib": [[round(at - zero, 2), _mib(rss)] for at, rss in self.rss],
            "lines": [
                [round(at - zero, 2), line[line.find("opencode: ") :]]
                for at, line in self.gateway.marked
            ],
        }


async def measured(watched: Watched, group: list, name: str, py_spy: str | None) -> dict[str, Any]:
    spy = start_py_spy(py_spy, f"managed-n{len(group)}-{name}", watched.gateway, None)
    cpu = proc.cpu_seconds(watched.gateway.pid)
    started = time.perf_counter()
    answers = await ask_all(group)
    if spy is not None:
        stop_py_spy(spy, py_spy, f"managed-n{len(group)}-{name}")
    figures = summary(answers, time.perf_counter() - started)
    figures["gateway_cpu_ms_per_ask"] = round(
        (proc.cpu_seconds(watched.gateway.pid) - cpu) * 1000 / len(group), 2
    )
    waits = [a["first_text"] - a["waits"] for a in answers if "waits" in a and "first_text" in a]
    figures["asks_that_waited_for_a_restart"] = len(waits)
    figures["longest_wait_for_a_restart_s"] = round(max(waits, default=0), 2)
    figures["opencode_rss_mib"] = watched.opencode_rss_mib()
    return figures


async def scenario(
    reactor,
    logs: Path,
    model: FakeModel,
    n: int,
    max_rss_mb: int | None,
    idle: int = IDLE_ASKS,
    py_spy: str | None = None,
    settings: dict[str, str] | None = None,
):
    watched = Watched(logs, f"managed-n{n}", model, max_rss_mb, settings)
    try:
        await watched.start(reactor)
        group = await computers(reactor, watched.port, n)
        (first,) = await computers(reactor, watched.port, 1, first_id=n + 1)
        await ask_all([first])
        figures: dict[str, Any] = {"computers": n}
        figures["round1"] = await measured(watched, group, "r1", py_spy)
        model.requests.clear()
        figures["round2"] = await measured(watched, group, "r2", py_spy)
        model.requests.clear()
        fresh = await computers(reactor, watched.port, idle, first_id=n + 2)
        await watched.settled(reactor)
        figures["idle_new"] = await one_at_a_time(fresh)
        figures["gateway_rss_mib"] = _mib(proc.rss_bytes(watched.gateway.pid))
        figures.update(watched.life())
        for c in [*group, first, *fresh]:
            c.transport.loseConnection()
        return figures
    finally:
        watched.stop()


def table(results: dict[str, Any]) -> str:
    """The figures as docs/benchmarks.md shows them."""
    lines = [
        "| N | failed r1 / r2 | first text p50 / p99, r1 | r2 | a new computer after, p50 "
        "| gateway CPU per ask r1 / r2 | opencode RSS peak | longest above bound + 1 instance "
        "| recycles | longest drain | restarts | longest wait for a restart |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in results["scenarios"]:
        r1, r2 = f["round1"], f["round2"]
        waited = max(r1["longest_wait_for_a_restart_s"], r2["longest_wait_for_a_restart_s"])
        restarts = f["restart_seconds"]
        lines.append(
            f"| {f['computers']} | {r1['failed']} / {r2['failed']} "
            f"| {r1['first_text_p50_ms']} / {r1['first_text_p99_ms']} ms "
            f"| {r2['first_text_p50_ms']} / {r2['first_text_p99_ms']} ms "
            f"| {f['idle_new']['first_text_p50_ms']} ms "
            f"| {r1['gateway_cpu_ms_per_ask']} / {r2['gateway_cpu_ms_per_ask']} ms "
            f"| {f['opencode_rss_peak_mib']:,.0f} MiB (bound {f['bound_mib']:,.0f}) "
            f"| {f['seconds_above_bound_plus_one_instance']} s | {f['recycles']} "
            f"| {f['drain_seconds_max']} s "
            f"| {min(restarts, default=0)}-{max(restarts, default=0)} s "
            f"| {waited} s ({r1['asks_that_waited_for_a_restart']} + "
            f"{r2['asks_that_waited_for_a_restart']} asks waited) |"
        )
    return "\n".join(lines)


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not (equals and name):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.askmanaged", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--computers", default="10,100,300", help="the sizes N, comma-separated")
    parser.add_argument(
        "--max-rss-mb", type=int, help="SANDBOX_OPENCODE_MAX_RSS_MB (default: the gateway's)"
    )
    parser.add_argument(
        "--idle-asks", type=int, default=IDLE_ASKS, help="new computers asking one at a time"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="NAME=VALUE",
        help="one more of the gateway's settings (SANDBOX_...), e.g. to try another bound",
    )
    parser.add_argument("--output", help="write the figures as JSON here")
    parser.add_argument(
        "--py-spy", metavar="DIR", help="record the gateway with py-spy during each round"
    )
    parser.add_argument("--logs", default=str(harness.REPO / "bench-results" / "ask-logs"))
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.computers.split(",")]
    settings = dict(args.set)
    proc.raise_fd_limit()
    if not OPENCODE.exists():
        raise SystemExit(f"{OPENCODE} is missing: 'make test' installs it")

    async def body(reactor):
        logs = Path(args.logs)
        logs.mkdir(parents=True, exist_ok=True)
        model, listening = await scripted_model(reactor)
        results: dict[str, Any] = {"computers": sizes, "scenarios": []}
        try:
            for n in sizes:
                figures = await scenario(
                    reactor, logs, model, n, args.max_rss_mb, args.idle_asks, args.py_spy, settings
                )
                results["scenarios"].append(figures)
                shown = {key: value for key, value in figures.items() if key != "timeline"}
                print(json.dumps(shown), flush=True)
        finally:
            await listening.stopListening()
        if args.output:
            Path(args.output).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(table(results))

    task.react(lambda reactor: defer.ensureDeferred(body(reactor)))


if __name__ == "__main__":
    main()
