"""
A computer's activity (SPEC §14) on a real gateway: who sent each request
(an operator, an account's token, the agent over ``/mcp``), and the asks
with the agent's text as it arrives, as ``watch_activity`` on ``/operator``
shows them.
"""

import orjson
import treq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.support import (
    accounts_file,
    admitted,
    both_modes,
    bounded,
    connect_operator,
    reactor,
    start_gateway,
)
from trapsandbox.admission import accounts

PASSWORD = "sesame"


class ActivityTests(TestCase):
    async def watched(self, gateway, secret, trapos_id="7:base", token=None):
        """A computer allowing exec and a watcher of its activity (an ``/operator`` socket)."""
        computer = await admitted(self, gateway.port, secret, trapos_id, ("exec",))
        watcher = await connect_operator(self, gateway.port, token)
        watcher.send({"id": "a", "type": "watch_activity", "traposId": trapos_id})
        return computer, watcher

    async def entry(self, watcher) -> dict:
        message = await watcher.next_message()
        self.assertEqual((message["id"], message.get("partial")), ("a", True), message)
        return message["payload"]["activity"]

    async def answered(self, computer, watcher, type="exec") -> tuple[dict, dict]:
        """The started and ended entries of the request the computer gets next (answered ok)."""
        request = await computer.next_message()
        self.assertEqual(request["type"], type)
        started = await self.entry(watcher)
        computer.respond(request, payload={"exitCode": 0, "stdout": "", "stderr": ""})
        ended = await self.entry(watcher)
        self.assertEqual((ended["n"], ended["state"]), (started["n"], "ok"))
        return started, ended

    async def test_each_entry_says_who_sent_it(self):
        gateway = start_gateway(self, password=PASSWORD)
        computer, watcher = await self.watched(gateway, PASSWORD)
        pool = HTTPConnectionPool(reactor(), persistent=False)
        base = f"http://127.0.0.1:{gateway.port}"
        # An operator over HTTP (loopback, no admin token: the admin).
        posted = treq.post(f"{base}/computers/7%3Abase/execute", json={"command": "ls"}, pool=pool)
        started, ended = await self.answered(computer, watcher)
        self.assertEqual(started, {"n": 1, "type": "exec", "detail": "ls", "by": "operator",
                                   "state": "started"})  # fmt: skip
        self.assertEqual(ended["by"], "operator")
        await bounded(treq.content(await bounded(posted)))
        # The agent: a tool called over /mcp.
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"computer": "7:base",
                                                             "command": "edit"}},
        }  # fmt: skip
        posted = treq.post(
            f"{base}/mcp",
            data=orjson.dumps(call),
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            pool=pool,
        )
        started, _ = await self.answered(computer, watcher)
        self.assertEqual((started["detail"], started["by"]), ("edit", "agent"))
        await bounded(treq.content(await bounded(posted)))
        # An operator on the /operator socket.
        operator = await connect_operator(self, gateway.port)
        operator.send({"id": 1, "traposId": "7:base", "type": "exec",
                       "payload": {"command": "ls", "args": ["/rom"]}})  # fmt: skip
        started, _ = await self.answered(computer, watcher)
        self.assertEqual((started["detail"], started["by"]), ("ls /rom", "operator"))
        self.assertNotIn("account", started)

    async def test_an_accounts_token_is_named(self):
        path = accounts_file(self, "alice")
        gateway = start_gateway(self, accounts_file=path, accounts=accounts.load(path))
        computer, watcher = await self.watched(gateway, "s-alice", "3:lab", "token-alice")
        operator = await connect_operator(self, gateway.port, "token-alice")
        operator.send({"id": 1, "traposId": "3:lab", "type": "exec",
                       "payload": {"command": "ls"}})  # fmt: skip
        started, ended = await self.answered(computer, watcher)
        self.assertEqual((started["by"], started["account"]), ("operator", "alice"))
        self.assertEqual((ended["by"], ended["account"]), ("operator", "alice"))
        # The token itself is nowhere in what a watcher gets.
        self.assertNotIn("token-alice", orjson.dumps([started, ended]).decode())

    async def test_an_ask_is_shown_with_the_agents_text_as_it_arrives(self):
        gateway = start_gateway(self, password=PASSWORD)
        answer: Deferred = Deferred()

        async def ask(account_id, trapos_id, capabilities, message_id, payload, emit, session=None):
            # opencode stands in here: what matters is what the activity makes of its partials
            # (sent at once, before the coroutine first waits: the ask is tracked before).
            emit({"type": "text_delta", "text": "Hello, "})
            emit({"type": "tool", "name": "trapsandbox_run_command", "status": "running"})
            emit({"type": "question", "id": "q1", "questions": [
                {"question": "Which file?", "options": []}]})  # fmt: skip
            emit({"type": "text_delta", "text": "Ada."})
            return await answer

        gateway.asks.ask = ask
        computer, watcher = await self.watched(gateway, PASSWORD)
        reply = computer.request("ask", {"prompt": "say hello " + "x" * 300})
        started = await self.entry(watcher)
        self.assertEqual(
            (started["type"], started["by"], started["state"]), ("ask", "player", "started")
        )
        # The prompt, cut as every value shown.
        self.assertEqual(started["detail"], ("say hello " + "x" * 300)[:199] + "\u2026")
        shown = [await self.entry(watcher) for _ in range(4)]
        self.assertEqual([e["state"] for e in shown], ["running"] * 4)
        self.assertEqual({e["n"] for e in shown}, {started["n"]})
        self.assertEqual(
            [{k: e[k] for k in e if k in ("text", "tool", "status", "question")} for e in shown],
            [
                {"text": "Hello, "},
                {"tool": "trapsandbox_run_command", "status": "running"},
                {"question": "Which file?"},
                {"text": "Ada."},
            ],
        )
        # The computer got the same partials, then the answer; the activity its end.
        self.assertEqual((await reply)["payload"], {"type": "text_delta", "text": "Hello, "})
        answer.callback({"sessionId": "ses_1", "text": "Hello, Ada."})
        ended = await self.entry(watcher)
        self.assertEqual((ended["n"], ended["state"]), (started["n"], "ok"))
        self.assertIsInstance(ended["durationMs"], int)


both_modes(globals(), "ActivityTests")
