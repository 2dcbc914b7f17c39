"""
Ask tokens (SPEC §11, ``opencode.tokens``): minted per computer, read from an
``Authorization`` header by the one bearer parser (``auth.bearer_token``),
revoked; on ``/mcp``, such a token reaches its own computer only.
"""

import orjson
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.fakes import FixedProbe, SandboxComputer
from tests.unit.opencode.helpers import URL, FakeHTTP, build_asks
from trapsandbox.admission import auth
from trapsandbox.computers.registry import Registry
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.opencode.tokens import AskTokens


class AskTokensTests(SynchronousTestCase):
    def setUp(self):
        self.tokens = AskTokens()
        self.token = self.tokens.token(("local", "1:a")).encode()

    def test_one_token_per_computer(self):
        self.assertEqual(self.tokens.token(("local", "1:a")).encode(), self.token)
        self.assertNotEqual(self.tokens.token(("other", "1:a")).encode(), self.token)
        self.assertGreaterEqual(len(self.token), 40)

    def test_the_scheme_is_read_in_any_case(self):
        for header in (b"Bearer ", b"bearer ", b"BEARER ", b"Bearer   "):
            self.assertEqual(self.tokens.scope_of(header + self.token), ("local", "1:a"), header)

    def test_anything_else_is_no_ask(self):
        for header in (
            None,
            b"",
            b"Bearer",
            b"Bearer ",
            b"Basic " + self.token,
            b"Bearer" + self.token,
            b"Bearer " + self.token + b"x",
            b"Bearer ask-wrong",
        ):
            self.assertIsNone(self.tokens.scope_of(header), header)

    def test_a_revoked_token_stops_working_and_the_next_is_new(self):
        self.tokens.revoke(("local", "1:a"))
        self.assertIsNone(self.tokens.scope_of(b"Bearer " + self.token))
        self.tokens.revoke(("local", "1:a"))  # twice: nothing to do
        renewed = self.tokens.token(("local", "1:a")).encode()
        self.assertNotEqual(renewed, self.token)
        self.assertEqual(self.tokens.scope_of(b"Bearer " + renewed), ("local", "1:a"))


class AskTokenOnMcpTests(SynchronousTestCase):
    """``POST /mcp`` with an ask's token: the asking computer only, whatever is named."""

    def setUp(self):
        clock = Clock()
        self.registry = Registry(clock, request_timeout=60)
        client = OpencodeClient(FakeHTTP(), clock, URL)
        self.asks = build_asks(client, clock, directory=self.mktemp())
        admission = auth.Admission(clock, admin_token="s3cret")
        app = gateway_app(
            self.registry, FixedProbe(ProbeResult(True, "")), admission, asks=self.asks
        )
        self.http = StubTreq(app.resource())

    def listed(self, authorization):
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_computers", "arguments": {"computer": "8:b"}},
        }
        response = self.successResultOf(
            self.http.post(
                "http://127.0.0.1:4444/mcp",
                data=orjson.dumps(message),
                headers={"content-type": "application/json", "authorization": authorization},
            )
        )
        body = self.successResultOf(self.http.content(response))
        return response.code, orjson.loads(body)

    def test_an_ask_token_in_any_case_lists_its_computer_only(self):
        SandboxComputer.connect(self.registry, "7:a")
        SandboxComputer.connect(self.registry, "8:b")
        token = self.asks.tokens.token(("local", "7:a"))
        for scheme in ("Bearer", "bearer"):
            code, answer = self.listed(f"{scheme} {token}")
            self.assertEqual(code, 200, answer)
            listed = answer["result"]["structuredContent"]["computers"]
            self.assertEqual([c["traposId"] for c in listed], ["7:a"], scheme)
        self.asks.tokens.revoke(("local", "7:a"))
        self.assertEqual(self.listed(f"Bearer {token}")[0], 401)
