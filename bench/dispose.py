"""
Does opencode give memory back when an instance is disposed (issue 33)?
The real ``opencode serve`` alone, no gateway: its agent the scripted model
of ``tests/harness/fake_model.py`` (a short text at once).

    python -m bench.dispose [--instances 40] [--rounds 3] [--env NAME=VALUE ...]

One warm-up prompt first (opencode loads its provider and agent machinery with
its first prompt of all); then, each round, ``--instances`` new directories
each get a session and one prompt (8 at a time), and every one of them is
disposed (``POST /instance/dispose?directory=D``).  opencode's RSS is read
after the warm-up, after each round's prompts, and 5 s after its disposals:
memory given back shows as a fall after the disposals; memory kept but reused
as a flat line over the rounds; memory kept for good as a climb of about one
round's worth per round.  ``--env`` sets variables in opencode's environment
(e.g. ``MIMALLOC_PURGE_DELAY=0``, ``BUN_JSC_*``); several ``--env`` sets are
compared when given as ``--variant 'A=1 B=2'`` (repeatable; the first run is
always without any, unless ``--no-baseline``).  With ``BUN_JSC_logGC=1`` in a
variant, JavaScriptCore logs every collection and each RSS figure comes with
``js_heap_mib``: the live JS heap after the last full collection before it
(what dispose frees of the instances' JS state, against what the process
keeps).  Everything listens on 127.0.0.1; opencode is stopped at the end of
each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import treq
from twisted.internet import defer, endpoints, task, threads
from twisted.web.client import HTTPConnectionPool
from twisted.web.server import Site

from bench import harness, proc
from bench.run import Child, _free_port

sys.path.insert(0, str(harness.REPO))

from tests.harness.fake_model import FakeModel  # noqa: E402

OPENCODE = Path(
    os.environ.get("OPENCODE_BIN")
    or harness.REPO / ".tools" / "opencode" / "node_modules" / ".bin" / "opencode"
)
PASSWORD = "bench-opencode"
AT_ONCE = 8
FULL_GC = re.compile(rb"=> FullCollection.*?=> (\d+)kb, p=", re.S)


def _mib(size: int) -> float:
    return round(size / 2**20, 1)


class Opencode:
    def __init__(self, reactor, model: FakeModel, extra_env: dict[str, str], logs: Path, label):
        self.reactor = reactor
        self.port = _free_port()
        self.home = Path(tempfile.mkdtemp(prefix="trapsandbox-bench-dispose-"))
        where = self.home / ".config" / "opencode"
        where.mkdir(parents=True)
        (where / "opencode.json").write_text(json.dumps(model.opencode_config()))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_SERVER_PASSWORD": PASSWORD,
            **extra_env,
        }
        argv = [str(OPENCODE), "serve", "--port", str(self.port), "--hostname", "127.0.0.1"]
        self.child = Child("opencode", argv, logs / f"dispose-{label}.log", None, env=env)
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.base = f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await threads.deferToThread(self.child.wait_listening, 60)
        deadline = time.monotonic() + 30
        while True:
            try:
                await self.call("GET", "/global/health", timeout=2)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await task.deferLater(self.reactor, 0.2, lambda: None)

    async def call(self, method, path, directory=None, body=None, timeout=60):
        params = {} if directory is None else {"directory": directory}
        d = treq.request(
            method,
            self.base + path,
            params=params,
            json=body,
            auth=("opencode", PASSWORD),
            pool=self.pool,
        )
        response = await d.addTimeout(timeout, self.reactor)
        content = await treq.content(response)
        if response.code >= 300:
            raise RuntimeError(f"{method} {path}: {response.code} {content[:200]!r}")
        return json.loads(content) if content else None

    async def prompt(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        session = await self.call("POST", "/session", directory, {"title": "bench"})
        body = {"parts": [{"type": "text", "text": "hello"}]}
        await self.call("POST", f"/session/{session['id']}/message", directory, body, 120)

    def rss(self) -> float:
        return _mib(proc.rss_bytes(self.child.pid))

    def mark(self) -> int:
        """Where opencode's log is now (its last few KiB may still be buffered)."""
        return os.path.getsize(self.child.log)

    def heaps_at(self, marks: list[int]) -> list[float | None]:
        """The JS heap after the last full collection before each mark (``BUN_JSC_logGC=1``)."""
        text = self.child.log.read_bytes()
        fulls = [
            (m.end(), int(m.group(1)))
            for m in FULL_GC.finditer(text)  # START … => FullCollection … => AFTERkb, p=
        ]
        found: list[float | None] = []
        for mark in marks:
            before = [kb for end, kb in fulls if end <= mark]
            found.append(round(before[-1] / 1024, 1) if before else None)
        return found

    def stop(self) -> None:
        self.child.stop()


async def _limited(calls, at_once: int) -> None:
    semaphore = defer.DeferredSemaphore(at_once)
    await defer.gatherResults(
        [semaphore.run(lambda c=c: defer.ensureDeferred(c())) for c in calls],
        consumeErrors=True,
    )


async def measure(reactor, model, extra_env, args, logs, label) -> dict:
    oc = Opencode(reactor, model, extra_env, logs, label)
    try:
        await oc.start()
        figures: dict = {"env": extra_env, "at_rest_mib": oc.rss()}
        warm = str(oc.home / "warm")
        await oc.prompt(warm)
        await oc.call("POST", "/instance/dispose", warm)
        await task.deferLater(reactor, 2, lambda: None)
        figures["warm_mib"] = oc.rss()
        marks = [oc.mark()]
        figures["rounds"] = []
        started = time.monotonic()
        for r in range(args.rounds):
            dirs = [str(oc.home / f"r{r}-c{i}") for i in range(args.instances)]
            try:
                await _limited([lambda d=d: oc.prompt(d) for d in dirs], AT_ONCE)
            except Exception as error:
                # opencode stops answering prompts past some size: that is a figure too.
                figures["failed"] = {"round": r, "rss_mib": oc.rss(), "error": repr(error)[:300]}
                print(label, r, figures["failed"], flush=True)
                break
            prompted = oc.rss()
            marks.append(oc.mark())
            await _limited(
                [lambda d=d: oc.call("POST", "/instance/dispose", d) for d in dirs], AT_ONCE
            )
            await task.deferLater(reactor, 5, lambda: None)
            figures["rounds"].append({"prompted_mib": prompted, "disposed_mib": oc.rss()})
            marks.append(oc.mark())
            print(label, r, figures["rounds"][-1], flush=True)
        figures["seconds"] = round(time.monotonic() - started, 1)
    finally:
        oc.stop()
    if extra_env.get("BUN_JSC_logGC"):
        await threads.deferToThread(oc.child.process.wait)
        await task.deferLater(reactor, 0.5, lambda: None)  # its log written out
        heaps = oc.heaps_at(marks)
        figures["warm_js_heap_mib"] = heaps[0]
        for n, each in enumerate(figures["rounds"]):
            each["prompted_js_heap_mib"] = heaps[1 + 2 * n]
            each["disposed_js_heap_mib"] = heaps[2 + 2 * n] if 2 + 2 * n < len(heaps) else None
    return figures


def _env(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dispose", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--instances", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], help="'A=1 B=2': env to try")
    parser.add_argument("--no-baseline", action="store_true", help="only the --variant runs")
    parser.add_argument("--logs", default=str(harness.REPO / "bench-results" / "ask-logs"))
    args = parser.parse_args(argv)
    variants = ([] if args.no_baseline else [""]) + args.variant
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)

    async def body(reactor):
        model = FakeModel("", {}, answer="Done. ")
        model.script = []
        listening = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
            Site(model)
        )
        model.port = listening.getHost().port
        try:
            for n, variant in enumerate(variants):
                figures = await measure(reactor, model, _env(variant), args, logs, f"v{n}")
                model.requests.clear()
                print(json.dumps(figures), flush=True)
        finally:
            await listening.stopListening()

    task.react(lambda reactor: defer.ensureDeferred(body(reactor)))


if __name__ == "__main__":
    main()
