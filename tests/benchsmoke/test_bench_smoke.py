"""
``python -m bench --quick`` end to end, so the benchmark cannot rot.

It runs every scenario tiny (a few computers, well under a second each)
against the real ``twistd trapsandbox`` and the bare Autobahn server, all on
127.0.0.1; the benchmark stops its own children, and the cleanup stops it.
The figures are not judged here (a shared machine is too noisy for that at
this size): only that every scenario ran and its counts add up.
"""

import os
import sys

import orjson
from twisted.trial.unittest import TestCase

from tests.harness.processes import REPO, clean_env, spawn

SCENARIOS = ("connect", "idle", "health", "burst", "ping", "opws", "churn")


class BenchSmokeTests(TestCase):
    async def test_quick_benchmark_runs_every_scenario(self):
        out = os.path.abspath(self.mktemp())
        os.makedirs(out)
        output = os.path.join(out, "quick.json")
        child = spawn(
            self,
            [sys.executable, "-m", "bench", "--quick", "--output", output],
            clean_env(),
            cwd=REPO,
        )
        self.assertEqual(await child.wait_ended(90), 0, child.output)
        self.assertIn("targets:", child.output)

        with open(output, "rb") as f:
            document = orjson.loads(f.read())
        self.assertEqual(document["server_log_errors"], {}, child.output)
        gateway, bare = document["results"]["gateway"], document["results"]["bare"]
        for name in SCENARIOS:
            self.assertNotIn("failed", gateway[name], name)
            self.assertEqual(gateway[name]["server_exit_code"], 0, name)
            if name not in ("ping", "opws"):
                self.assertNotIn("failed", bare[name], name)
                self.assertEqual(bare[name]["server_exit_code"], 0, name)

        params = document["parameters"]
        for figures in (gateway, bare):
            connect = figures["connect"]
            self.assertEqual(connect["connected"], params["connect"]["computers"])
            self.assertGreater(connect["hellos_per_s"], 0)
            self.assertIsNotNone(connect["handshake"]["p99_ms"])
            self.assertEqual(figures["idle"]["computers"], params["idle"]["steps"][-1])
            self.assertIsInstance(figures["idle"]["bytes_per_computer"], int)
            self.assertGreater(figures["health"]["answered"], 0)
            self.assertEqual(figures["health"]["errors"], {})
            self.assertTrue(figures["burst"]["all_answered"], figures["burst"])
            self.assertEqual(figures["churn"]["completed"], params["churn"]["cycles"])
            self.assertEqual(figures["churn"]["errors"], {})
            for name in ("connect", "health", "burst", "churn"):
                self.assertIn("server_cpu_us_per_op", figures[name], name)

        # The gateway side: the registry, the shared opencode probe, the operator endpoint.
        self.assertEqual(gateway["idle"]["registered"], params["idle"]["steps"][-1])
        # Shared and reused for a second: the burst makes at most one or two requests.
        self.assertLessEqual(gateway["burst"]["opencode_requests"], 2)
        self.assertEqual(gateway["churn"]["registered_end"], 0)
        ping = gateway["ping"]
        if "skipped" not in ping:
            self.assertGreater(ping["answered"], 0)
            self.assertEqual(ping["errors"], {})
            self.assertGreaterEqual(ping["answered_by_computers"], ping["answered"])
        opws = gateway["opws"]
        self.assertNotIn("skipped", opws)
        self.assertGreater(opws["answered"], 0)
        self.assertEqual(opws["errors"], {})
        self.assertGreaterEqual(opws["answered_by_computers"], opws["answered"])
        self.assertIn("server_cpu_us_per_op", opws)
        self.assertEqual(len(document["targets"]), 5)
        self.assertIn("health: round trips/s", document["ratios"])

    async def test_sandbox_benchmark_runs(self):
        """``python -m bench.sandbox``: exec round trips; 64 KiB to 1 MiB files back identical."""
        output = os.path.abspath(self.mktemp())
        child = spawn(
            self,
            [sys.executable, "-m", "bench.sandbox", "--execs", "5", "--output", output],
            clean_env(),
            cwd=REPO,
        )
        self.assertEqual(await child.wait_ended(60), 0, child.output)
        with open(output, "rb") as f:
            figures = orjson.loads(f.read())
        self.assertEqual(figures["exec"]["count"], 5)
        self.assertGreater(figures["exec"]["p50_ms"], 0)
        self.assertEqual([f["bytes"] for f in figures["files"]], [65536, 300000, 1048576])

    async def test_snapshot_benchmark_runs_end_to_end(self):
        """``python -m bench.snapshots --computer``: a gateway and a harness computer."""
        child = spawn(
            self, [sys.executable, "-m", "bench.snapshots", "--computer"], clean_env(), cwd=REPO
        )
        self.assertEqual(await child.wait_ended(90), 0, child.output)
        figures = orjson.loads(child.output[child.output.index("{") :])
        self.assertIn("(103 files", figures["first snapshot"])
        self.assertIn("(0 fetched)", figures["nothing changed"])
        self.assertIn("(10 written, 0 deleted)", figures["restore of 10 changed files"])
        self.assertEqual(figures["snapshots listed"], 10)

    async def test_live_benchmark_runs(self):
        """``python -m bench.live``, tiny: one row change under 300 bytes, idle silent, CPU run."""
        output = os.path.abspath(self.mktemp())
        argv = ["--idle", "1", "--presses", "3", "--computers", "3", "--seconds", "1"]
        child = spawn(
            self,
            [sys.executable, "-m", "bench.live", *argv, "--output", output],
            clean_env(),
            cwd=REPO,
        )
        self.assertEqual(await child.wait_ended(90), 0, child.output)
        with open(output, "rb") as f:
            figures = orjson.loads(f.read())
        change = figures["one_row_change"]
        self.assertEqual(change["rows_in_frame"], [1])
        self.assertTrue(all(size < 300 for size in change["computer_to_gateway_message_bytes"]))
        self.assertEqual([v for k, v in figures["idle"].items() if k.endswith("bytes")], [0, 0, 0])
        self.assertEqual(figures["latency_harness"]["presses"], 3)
        self.assertEqual(figures["cpu"]["computers"], 3)
        self.assertGreater(figures["cpu"]["frames_delivered_per_second"], 0)


class FairShareBenchSmokeTests(TestCase):
    async def test_the_fair_share_benchmark_runs_tiny(self):
        out = os.path.abspath(self.mktemp())
        os.makedirs(out)
        output = os.path.join(out, "fairshare.json")
        argv = [sys.executable, "-m", "bench.fairshare", "--computers", "3", "--changes", "2"]
        argv += ["--frames", "30", "--idle", "0.2", "--output", output]
        child = spawn(self, argv, clean_env(), cwd=REPO)
        self.assertEqual(await child.wait_ended(90), 0, child.output)
        with open(output, "rb") as f:
            document = orjson.loads(f.read())
        one, many = document["changes"]
        self.assertEqual((one["watches_asked"], many["watches_asked"]), (1, 4096))
        self.assertEqual(one["changes"], 4)
        huge, largest = document["hostile_frames"]
        self.assertEqual(huge["watch"], "ended 413 too_large")
        self.assertGreaterEqual(largest["frames_delivered"], 1)
