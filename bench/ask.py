"""
``sandbox ask`` for a whole server (issue 33): the real ``twistd trapsandbox``
and the real ``opencode serve`` (its agent the scripted model of
``tests/harness/fake_model.py``, answering at once with a short text), N
computers each asking once, then again after their instances were given back.

    python -m bench.ask [--quick] [--computers 10,100,300] [--output FILE]

For each N, with the bound on live instances (``SANDBOX_ASK_MAX_INSTANCES``,
32) and without it (100,000; only up to ``--unbounded-up-to``, 100: opencode
holds ~55 MiB per instance that has run a prompt, 300 would be ~16 GiB):

- round 1: every computer asks at once (a new session, a new instance), the
  gateway's queue letting ``SANDBOX_ASK_MAX_RUNNING`` (16) run at a time;
- round 2: every computer asks again (with the bound, all but the last 32
  instances were given back meanwhile and come back for it);
- idle: 10 computers ask one after another with nothing else running: new
  ones (a new session and instance), the same again (instance live), and, when
  N is over the bound, 10 of the first (their instances given back).

Before the rounds one more computer asks once: opencode loads the model's
provider and its agent machinery with its first prompt of all (~450 MiB), and
the rounds are to measure the instances, not that.

Figures: opencode RSS at rest and after each round (its whole RSS: one
process); the gateway's RSS and its CPU per ask (``/proc/PID/stat``); the
time from an ask to its first text partial, p50 and p99; asks per minute.
Last, asks per minute with every computer asking at once through one and
through two opencode servers (``OPENCODE_URL`` a list), N = ``--servers-with``
(100) at most.

The computers are WebSocket clients speaking the protocol (hello, then
``ask``), in this process; the model too.  Everything listens on 127.0.0.1;
every child is stopped at the end.  Logs go to ``bench-results/ask-logs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import treq
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, endpoints, task, threads
from twisted.web.client import HTTPConnectionPool
from twisted.web.server import Site

from bench import harness, proc
from bench.run import (
    ADMIN_TOKEN,
    SECRET,
    Child,
    _free_port,
    _with_repo_path,
    start_py_spy,
    stop_py_spy,
)

sys.path.insert(0, str(harness.REPO))

from tests.harness.fake_model import FakeModel  # noqa: E402
from trapsandbox.ops import ctl  # noqa: E402

BIN = Path(sys.executable).parent
OPENCODE = Path(
    os.environ.get("OPENCODE_BIN")
    or harness.REPO / ".tools" / "opencode" / "node_modules" / ".bin" / "opencode"
)
OPENCODE_PASSWORD = "bench-opencode"
ANSWER = "Done: the computer is fine. "
BOUND = 32
UNBOUNDED = 100_000
RUNNING = 16
IDLE_ASKS = 10
# What docs/operations.md recommends for opencode's environment (see there and bench.dispose).
OPENCODE_ENV = "BUN_JSC_forceRAMSize=1073741824"
# How the gateway tells a player that the opencode it runs is (re)starting (``asks``).
WAITS = "your ask waits for it)\n"


class AskingComputer(WebSocketClientProtocol):
    """A computer that says hello and asks; each ask's times are kept."""

    def onOpen(self) -> None:
        self.waiting: dict[str, dict[str, Any]] = {}
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        ask = self.waiting.get(frame.get("messageId"))
        if ask is None:
            return
        now = time.perf_counter()
        if frame.get("partial"):
            payload = frame.get("payload") or {}
            if payload.get("type") == "text_delta" and "first_text" not in ask:
                if str(payload.get("text")).endswith(WAITS):
                    ask["waits"] = now - ask["sent"]  # for opencode the gateway runs
                else:
                    ask["first_text"] = now - ask["sent"]
            return
        del self.waiting[frame["messageId"]]
        ask["ok"] = frame.get("ok") is True
        if not ask["ok"]:
            ask["error"] = frame.get("error")
        ask["total"] = now - ask["sent"]
        ask["done"].callback(ask)

    def request(self, message_id: str, kind: str, payload: dict[str, Any]) -> defer.Deferred:
        ask: dict[str, Any] = {"sent": time.perf_counter(), "done": defer.Deferred()}
        self.waiting[message_id] = ask
        frame = {
            "event": "computer_request",
            "traposSenderId": self.trapos_id,
            "messageId": message_id,
            "type": kind,
            "payload": payload,
        }
        self.sendMessage(orjson.dumps(frame))
        return ask["done"]


async def computers(reactor, port: int, count: int, first_id: int = 1) -> list[AskingComputer]:
    """``count`` computers connected to the gateway on ``port`` and past their hello."""
    connected = []
    for n in range(first_id - 1, first_id - 1 + count):
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway")
        factory.protocol = AskingComputer
        factory.opened = defer.Deferred()
        endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        await endpoint.connect(factory)
        c = await factory.opened
        c.trapos_id = f"{n + 1}:bench"
        c.asked = 0
        hello = await c.request("hello", "hello", {"traposId": c.trapos_id, "secret": SECRET})
        assert hello["ok"], hello
        connected.append(c)
    return connected


async def ask_all(group: list[AskingComputer]) -> list[dict[str, Any]]:
    """Every computer of ``group`` asks at once; their answers."""
    asks = []
    for c in group:
        c.asked += 1
        asks.append(c.request(f"ask-{c.asked}", "ask", {"prompt": "is all well?", "yes": True}))
    return list(await defer.gatherResults(asks))


def summary(answers: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    firsts = [a["first_text"] for a in answers if "first_text" in a]
    failed = [a.get("error") for a in answers if not a["ok"]]
    return {
        "asks": len(answers),
        "failed": len(failed),
        "first_errors": failed[:3],
        "first_text_p50_ms": _ms(harness.percentile(firsts, 0.5)) if firsts else None,
        "first_text_p99_ms": _ms(harness.percentile(firsts, 0.99)) if firsts else None,
        "seconds": round(seconds, 2),
        "asks_per_minute": round(len(answers) / seconds * 60, 1) if seconds else None,
        # Each one, in the order asked, for the rounds of one ask at a time (a few).
        **({"first_texts_ms": [_ms(f) for f in firsts]} if len(answers) <= 20 else {}),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _mib(size: int) -> float:
    return round(size / 2**20, 1)


class Setup:
    """opencode servers and a gateway in front of them, each a child process."""

    def __init__(
        self,
        logs: Path,
        label: str,
        servers: int,
        max_instances: int,
        idle_ms: int,
        opencode_env: dict[str, str],
        py_spy: str | None = None,
    ):
        self.logs, self.label = logs, label
        self.opencode_env = opencode_env
        # A folder: the gateway recorded by py-spy during each measured round.
        self.py_spy = py_spy
        self.ports = [_free_port() for _ in range(servers)]
        self.state = tempfile.mkdtemp(prefix="trapsandbox-bench-ask-")
        env = _with_repo_path()
        env.update(
            SANDBOX_PASSWORD=SECRET,
            SANDBOX_ADMIN_TOKEN=ADMIN_TOKEN,
            SANDBOX_STATE_DIR=self.state,
            OPENCODE_URL=",".join(f"http://127.0.0.1:{p}" for p in self.ports),
            OPENCODE_SERVER_PASSWORD=OPENCODE_PASSWORD,
            SANDBOX_ASK_MAX_INSTANCES=str(max_instances),
            SANDBOX_ASK_MAX_RUNNING=str(RUNNING),
            SANDBOX_ASK_MAX_RUNNING_PER_ACCOUNT=str(UNBOUNDED),
            SANDBOX_ASK_INSTANCE_IDLE_MS=str(idle_ms),
            SANDBOX_MAX_ASK_CONVERSATIONS=str(UNBOUNDED),
        )
        argv = [str(BIN / "twistd"), "-n", "--pidfile=", "trapsandbox"]
        argv += ["--port", "tcp:0:interface=127.0.0.1:backlog=1024"]
        self.gateway = Child("gateway", argv, logs / f"{label}-gateway.log", None, env=env)
        self.opencodes: list[Child] = []

    async def start(self, reactor, model: FakeModel) -> int:
        port = await threads.deferToThread(self.gateway.wait_listening)
        self.port = port
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(f"http://127.0.0.1:{port}", True),
        }
        for n, oc_port in enumerate(self.ports):
            home = Path(tempfile.mkdtemp(prefix="trapsandbox-bench-opencode-"))
            where = home / ".config" / "opencode"
            where.mkdir(parents=True)
            (where / "opencode.json").write_text(json.dumps(config))
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(home),
                "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local" / "share"),
                "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_STATE_HOME": str(home / ".local" / "state"),
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_SERVER_PASSWORD": OPENCODE_PASSWORD,
                "SANDBOX_ADMIN_TOKEN": ADMIN_TOKEN,
                **self.opencode_env,
            }
            argv = [str(OPENCODE), "serve", "--port", str(oc_port), "--hostname", "127.0.0.1"]
            log = self.logs / f"{self.label}-opencode{n}.log"
            child = Child(f"opencode{n}", argv, log, None, env=env, cwd=str(home))
            self.opencodes.append(child)
            await threads.deferToThread(child.wait_listening, 60)
        # opencode accepts before it answers: let it settle on its own first request.
        for child in self.opencodes:
            await _answering(reactor, child.port)
        return port

    def opencode_rss(self) -> list[float]:
        return [_mib(proc.rss_bytes(child.pid)) for child in self.opencodes]

    def stop(self) -> None:
        for child in [self.gateway, *self.opencodes]:
            child.stop()


async def _answering(
    reactor, port: int, path: str = "/global/health", auth: Any = ("opencode", OPENCODE_PASSWORD)
) -> None:
    """Wait until opencode (or another server) answers ``path``: it accepts before it answers,
    and each try is bounded."""
    deadline = time.monotonic() + 30
    pool = HTTPConnectionPool(reactor, persistent=False)
    url = f"http://127.0.0.1:{port}{path}"
    while True:
        try:
            d = treq.get(url, auth=auth, pool=pool)
            response = await d.addTimeout(2, reactor)
            await treq.content(response)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await task.deferLater(reactor, 0.2, lambda: None)


async def measured_round(setup: Setup, group: list[AskingComputer], name: str) -> dict[str, Any]:
    spy = start_py_spy(setup.py_spy, f"{setup.label}-{name}", setup.gateway, None)
    cpu = proc.cpu_seconds(setup.gateway.pid)
    started = time.perf_counter()
    answers = await ask_all(group)
    seconds = time.perf_counter() - started
    if spy is not None:
        stop_py_spy(spy, setup.py_spy, f"{setup.label}-{name}")
    figures = summary(answers, seconds)
    figures["gateway_cpu_ms_per_ask"] = round(
        (proc.cpu_seconds(setup.gateway.pid) - cpu) * 1000 / len(group), 2
    )
    figures["gateway_rss_mib"] = _mib(proc.rss_bytes(setup.gateway.pid))
    figures["opencode_rss_mib"] = setup.opencode_rss()
    return figures


async def one_at_a_time(group: list[AskingComputer]) -> dict[str, Any]:
    answers = []
    started = time.perf_counter()
    for c in group:
        answers.extend(await ask_all([c]))
    return summary(answers, time.perf_counter() - started)


async def scenario(
    reactor,
    logs: Path,
    model: FakeModel,
    n: int,
    bound: int,
    opencode_env: dict[str, str],
    py_spy: str | None,
) -> dict[str, Any]:
    label = f"n{n}-{'bound' if bound < UNBOUNDED else 'unbounded'}"
    setup = Setup(logs, label, 1, bound, 3_600_000, opencode_env, py_spy)
    try:
        port = await setup.start(reactor, model)
        group = await computers(reactor, port, n)
        figures: dict[str, Any] = {
            "computers": n,
            "max_instances": bound,
            "opencode_rss_at_rest_mib": setup.opencode_rss(),
            "gateway_rss_at_rest_mib": _mib(proc.rss_bytes(setup.gateway.pid)),
        }
        # opencode loads the model's provider and its agent machinery with the first prompt
        # of all: one computer more asks first, so that the rounds measure the instances.
        (first,) = await computers(reactor, port, 1, first_id=n + 1)
        await ask_all([first])
        figures["opencode_rss_warm_mib"] = setup.opencode_rss()
        figures["round1"] = await measured_round(setup, group, "r1")
        model.requests.clear()
        figures["round2"] = await measured_round(setup, group, "r2")
        model.requests.clear()
        if bound < UNBOUNDED:
            # One ask at a time, nothing else running: a computer asking for the first time
            # (a new session and instance), one whose instance is live, one whose was given back
            # (past the bound, the least recently used: only when N is over it).
            fresh = await computers(reactor, port, min(IDLE_ASKS, n), first_id=n + 2)
            figures["idle_new"] = await one_at_a_time(fresh)
            figures["idle_warm"] = await one_at_a_time(fresh)
            if n > bound + IDLE_ASKS:
                figures["idle_given_back"] = await one_at_a_time(group[: min(IDLE_ASKS, n)])
            group += fresh
        group.append(first)
        for c in group:
            c.transport.loseConnection()
        return figures
    finally:
        setup.stop()


async def through(
    reactor,
    logs: Path,
    model: FakeModel,
    n: int,
    servers: int,
    opencode_env: dict[str, str],
    py_spy: str | None,
) -> dict[str, Any]:
    label = f"n{n}-servers{servers}"
    setup = Setup(logs, label, servers, BOUND, 3_600_000, opencode_env, py_spy)
    try:
        port = await setup.start(reactor, model)
        group = await computers(reactor, port, n)
        figures = {"computers": n, "servers": servers}
        figures["round1"] = await measured_round(setup, group, "r1")
        model.requests.clear()
        figures["round2"] = await measured_round(setup, group, "r2")
        model.requests.clear()
        for c in group:
            c.transport.loseConnection()
        return figures
    finally:
        setup.stop()


async def scripted_model(reactor) -> tuple[FakeModel, Any]:
    """The scripted model answering every prompt at once with ``ANSWER``, and its port."""
    model = FakeModel("", {}, answer=ANSWER)
    model.script = []  # no tool call: the answer at once
    listening = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        Site(model)
    )
    model.port = listening.getHost().port
    return model, listening


async def run(reactor, args: argparse.Namespace) -> dict[str, Any]:
    if not OPENCODE.exists():
        raise SystemExit(f"{OPENCODE} is missing: 'make test' installs it")
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    model, listening = await scripted_model(reactor)
    results: dict[str, Any] = {
        "computers": args.computers,
        "opencode_env": args.opencode_env,
        "scenarios": [],
        "servers": [],
    }
    try:
        for n in args.computers:
            for bound in (BOUND, UNBOUNDED):
                if bound == UNBOUNDED and n > args.unbounded_up_to:
                    continue
                figures = await scenario(
                    reactor, logs, model, n, bound, args.opencode_env, args.py_spy
                )
                results["scenarios"].append(figures)
                print(json.dumps(figures), flush=True)
        n = min(args.computers[-1], args.servers_with)
        for servers in (1, 2) if n > 0 else ():
            figures = await through(
                reactor, logs, model, n, servers, args.opencode_env, args.py_spy
            )
            results["servers"].append(figures)
            print(json.dumps(figures), flush=True)
    finally:
        await listening.stopListening()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ask", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="3 computers (a smoke run)")
    parser.add_argument("--computers", default="10,100,300", help="the sizes N, comma-separated")
    parser.add_argument("--output", help="write the figures as JSON here")
    parser.add_argument(
        "--unbounded-up-to",
        type=int,
        default=100,
        help="without the bound only up to this N (opencode holds ~55 MiB per instance)",
    )
    parser.add_argument(
        "--servers-with",
        type=int,
        default=100,
        help="N of the one-or-two-servers comparison (0: none)",
    )
    parser.add_argument(
        "--opencode-env",
        default=OPENCODE_ENV,
        help="'NAME=VALUE ...' added to opencode's environment (docs/operations.md); '' for none",
    )
    parser.add_argument("--logs", default=str(harness.REPO / "bench-results" / "ask-logs"))
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="record the gateway with py-spy during each round (raw stacks and a summary in "
        "DIR; the figures of a profiled run are perturbed)",
    )
    args = parser.parse_args(argv)
    args.opencode_env = dict(pair.split("=", 1) for pair in args.opencode_env.split())
    args.computers = [3] if args.quick else [int(n) for n in args.computers.split(",")]
    proc.raise_fd_limit()

    async def body(reactor):
        results = await run(reactor, args)
        if args.output:
            Path(args.output).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        print(table(results))

    task.react(lambda reactor: defer.ensureDeferred(body(reactor)))


def table(results: dict[str, Any]) -> str:
    """The figures as docs/benchmarks.md shows them."""
    lines = [
        "| N | instances bound | opencode RSS at rest / warm | after round 1 | after round 2 "
        "| gateway RSS after | gateway CPU per ask (r1 / r2) | first text p50 / p99 (r1) "
        "| first text p50 / p99 (r2) | asks/min (r1 / r2) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in results["scenarios"]:
        r1, r2 = f["round1"], f["round2"]
        bound = f["max_instances"] if f["max_instances"] < UNBOUNDED else "none"
        lines.append(
            f"| {f['computers']} | {bound} | {f['opencode_rss_at_rest_mib'][0]} / "
            f"{f['opencode_rss_warm_mib'][0]} MiB "
            f"| {r1['opencode_rss_mib'][0]} MiB | {r2['opencode_rss_mib'][0]} MiB "
            f"| {r2['gateway_rss_mib']} MiB "
            f"| {r1['gateway_cpu_ms_per_ask']} / {r2['gateway_cpu_ms_per_ask']} ms "
            f"| {r1['first_text_p50_ms']} / {r1['first_text_p99_ms']} ms "
            f"| {r2['first_text_p50_ms']} / {r2['first_text_p99_ms']} ms "
            f"| {r1['asks_per_minute']} / {r2['asks_per_minute']} |"
        )
    lines += ["", "| N | one ask at a time | first text p50 / p99 |", "|---|---|---|"]
    for f in results["scenarios"]:
        for name in ("idle_new", "idle_warm", "idle_given_back"):
            if name in f:
                lines.append(
                    f"| {f['computers']} | {name} ({f[name]['asks']} asks) "
                    f"| {f[name]['first_text_p50_ms']} / {f[name]['first_text_p99_ms']} ms |"
                )
    lines += ["", "| N | opencode servers | asks/min (r1 / r2) | failed |", "|---|---|---|---|"]
    for f in results["servers"]:
        r1, r2 = f["round1"], f["round2"]
        lines.append(
            f"| {f['computers']} | {f['servers']} | {r1['asks_per_minute']} / "
            f"{r2['asks_per_minute']} | {r1['failed'] + r2['failed']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
