"""
``python -m bench.ask`` end to end with two computers, so the benchmark of
issue 33 cannot rot: the real ``twistd trapsandbox``, the real ``opencode
serve`` (as the ask e2e tests use it) and the scripted model, all on
127.0.0.1; the benchmark stops its own children, and the cleanup stops it.
The figures are not judged (a shared machine is too noisy at this size): only
that every ask was answered and each figure is there.
"""

import os
import sys

import orjson
from twisted.trial.unittest import TestCase

from tests.harness.opencode import OPENCODE
from tests.harness.processes import REPO, clean_env, spawn


async def run_bench(testcase, module: str, *args: str) -> tuple[dict, str]:
    """``python -m module args`` with the real opencode: its JSON figures, and what it printed."""
    if not os.path.exists(OPENCODE):
        testcase.fail(f"{OPENCODE} is missing: 'make test' installs it")
    out = os.path.abspath(testcase.mktemp())
    os.makedirs(out)
    output = os.path.join(out, "figures.json")
    argv = [sys.executable, "-m", module, *args, "--output", output, "--logs", out]
    child = spawn(testcase, argv, clean_env(OPENCODE_BIN=OPENCODE), cwd=REPO)
    testcase.assertEqual(await child.wait_ended(200), 0, child.output)
    with open(output, "rb") as f:
        return orjson.loads(f.read()), child.output


class BenchAskSmokeTests(TestCase):
    timeout = 240

    async def test_two_computers_ask_twice_and_one_at_a_time(self):
        # Without the one-or-two-servers comparison: three opencode starts more (a minute).
        results, printed = await run_bench(
            self, "bench.ask", "--computers", "2", "--unbounded-up-to", "0", "--servers-with", "0"
        )
        (scenario,) = results["scenarios"]
        self.assertEqual((scenario["computers"], scenario["max_instances"]), (2, 32))
        for name in ("round1", "round2", "idle_new", "idle_warm"):
            figures = scenario[name]
            self.assertEqual(figures["failed"], 0, (name, figures))
            self.assertIsNotNone(figures["first_text_p50_ms"], name)
        for name in ("round1", "round2"):
            # (CPU is counted in clock ticks: two asks may cost none.)
            self.assertGreaterEqual(scenario[name]["gateway_cpu_ms_per_ask"], 0)
            self.assertGreater(scenario[name]["opencode_rss_mib"][0], 0)
        self.assertEqual(results["servers"], [])
        self.assertIn("| 2 | 32 |", printed)


class BenchAskManagedSmokeTests(TestCase):
    timeout = 240

    async def test_two_computers_ask_through_recycles_of_the_gateways_own_opencode(self):
        # A bound of 1 MB: every ask's end finds opencode past it.
        results, printed = await run_bench(
            self, "bench.askmanaged", "--computers", "2", "--max-rss-mb", "1", "--idle-asks", "2"
        )
        (scenario,) = results["scenarios"]
        for name in ("round1", "round2", "idle_new"):
            self.assertEqual(scenario[name]["failed"], 0, (name, scenario[name]))
            self.assertIsNotNone(scenario[name]["first_text_p50_ms"], name)
        self.assertGreaterEqual(scenario["recycles"], 2)
        self.assertEqual(len(scenario["restart_seconds"]), scenario["recycles"])
        self.assertEqual(len(scenario["stop_seconds"]), scenario["recycles"])  # each logged
        waited = sum(scenario[r]["asks_that_waited_for_a_restart"] for r in ("round1", "round2"))
        self.assertGreater(waited, 0)
        self.assertIn("| 2 | 0 / 0 |", printed)
