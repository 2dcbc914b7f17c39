"""
The console in cluster mode (SPEC §13, §14): an ``/operator`` socket on one real
``twistd`` process watches the computers and the activity of every process.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.cluster.helpers import Http, Pinged, start_gateway
from tests.harness.redis import start_redis
from tests.harness.support import accounts_file, connect, connect_operator

ADMIN = "admin-token-1234"


async def _listed_until(watcher, condition):
    """
    The ``watch_computers`` listings ``watcher`` gets until one's computers
    meet ``condition`` (each bounded by ``next_message``).
    """
    seen = []
    while True:
        message = await watcher.next_message()
        assert message.get("partial"), message
        seen.append(message["payload"])
        if condition(message["payload"]["computers"]):
            return seen


def _names(computers) -> list[tuple[str, str]]:
    return [(c["traposId"], c["accountId"]) for c in computers]


async def _until_watched(testcase, operator, watcher):
    """
    Ping the computer through ``operator`` until ``watcher``'s activity watch
    sees a ping start (and then end): the watch now reaches the computer.
    """
    for n in range(200):
        operator.send({"id": f"p{n}", "traposId": "5:lab", "type": "ping"})
        testcase.assertEqual((await operator.next_message())["status"], 200)
        while watcher.messages.pending:
            entry = (await watcher.next_message())["payload"]["activity"]
            if entry["state"] == "started":
                ended = (await watcher.next_message())["payload"]["activity"]
                testcase.assertEqual((ended["n"], ended["state"]), (entry["n"], "ok"))
                return
    testcase.fail("the watch saw no ping")


async def _next(watcher):
    """
    ``watcher``'s next message that is not about a ping: the entries of the last pings
    ``_until_watched`` sent may still be on their way (through Redis) after its answer.
    """
    while True:
        message = await watcher.next_message()
        if (message.get("payload") or {}).get("activity", {}).get("type") != "ping":
            return message


class ClusterConsoleTests(TestCase):
    timeout = 120

    async def gateways(self):
        redis = await start_redis(self)
        settings = {"SANDBOX_ACCOUNTS_FILE": accounts_file(self, "alice", "bob")}
        settings["SANDBOX_ADMIN_TOKEN"] = ADMIN
        a = await start_gateway(self, redis.url, **settings)
        b = await start_gateway(self, redis.url, **settings)
        return a, b

    async def test_a_watcher_sees_the_computers_of_its_account_on_every_process(self):
        a, b = await self.gateways()
        alice = await connect_operator(self, b.port, "token-alice")
        bob = await connect_operator(self, b.port, "token-bob")
        for watcher in (alice, bob):
            watcher.send({"id": "w", "type": "watch_computers"})
            self.assertEqual((await watcher.next_message())["payload"], {"computers": []})

        bobs = await connect(self, a.port)
        self.assertTrue((await bobs.hello("s-bob", "2:bob"))["ok"])
        computer = await connect(self, a.port)
        self.assertTrue((await computer.hello("s-alice", "5:lab"))["ok"])
        seen = await _listed_until(alice, lambda c: _names(c) == [("5:lab", "alice")])
        # Bob's computer never reaches alice's watch, nor hers bob's.
        self.assertNotIn(("2:bob", "bob"), [n for each in seen for n in _names(each["computers"])])
        await _listed_until(bob, lambda c: _names(c) == [("2:bob", "bob")])
        # The entry is /computers' own.
        (entry,) = seen[-1]["computers"]
        code, listed = await Http().get(b, "/computers", token="token-alice")
        self.assertEqual(code, 200)
        self.assertEqual(
            [{k: v for k, v in c.items() if k != "inFlight"} for c in listed["computers"]],
            [{k: v for k, v in entry.items() if k != "inFlight"}],
        )
        self.assertEqual((entry["gateway"], entry["capabilities"]), (a.instance, []))

        # A change of capabilities there, then a disconnect.
        answer = await computer.request("capabilities", {"capabilities": ["screen"]})
        self.assertTrue(answer["ok"], answer)
        await _listed_until(alice, lambda c: c and c[0]["capabilities"] == ["screen"])
        computer.transport.loseConnection()
        seen = await _listed_until(alice, lambda c: c == [])
        self.assertEqual(len(seen), 1)

    async def test_a_watcher_sees_the_activity_of_a_computer_on_another_process(self):
        a, b = await self.gateways()
        computer = await connect(self, a.port, protocol=Pinged)
        self.assertTrue((await computer.hello("s-alice", "5:lab", ["exec"]))["ok"])
        watcher = await connect_operator(self, b.port, "token-alice")
        watcher.send({"id": "act", "type": "watch_activity", "traposId": "5:lab"})
        # Bob's token cannot watch alice's computer on any process: it answers as a missing one.
        bob = await connect_operator(self, b.port, "token-bob")
        for trapos_id in ("5:lab", "5:none"):
            bob.send({"id": "act", "type": "watch_activity", "traposId": trapos_id})
            refused = await bob.next_message()
            self.assertEqual((refused["id"], refused["status"]), ("act", 404))
            self.assertEqual(
                refused["error"],
                {"code": "not_connected", "message": f"{trapos_id} is not connected"},
            )
        operators = {}
        for gateway in (a, b):
            operators[gateway] = await connect_operator(self, gateway.port, "token-alice")
        await _until_watched(self, operators[a], watcher)

        # A request through each process, by alice's token: each is seen once, started then ended.
        for n, gateway in enumerate((b, a)):
            operator = operators[gateway]
            operator.send(
                {"id": n, "traposId": "5:lab", "type": "exec", "payload": {"command": "ls"}}
            )
            request = await computer.next_message()
            started = (await _next(watcher))["payload"]["activity"]
            self.assertEqual(
                {k: started.get(k) for k in ("type", "detail", "by", "account", "state")},
                {
                    "type": "exec",
                    "detail": "ls",
                    "by": "operator",
                    "account": "alice",
                    "state": "started",
                },
            )
            computer.respond(request, payload={"exitCode": 0})
            ended = (await _next(watcher))["payload"]["activity"]
            self.assertEqual((ended["n"], ended["state"]), (started["n"], "ok"))
            self.assertEqual((await operator.next_message())["status"], 200)

        # The computer leaving ends the watch.
        computer.transport.loseConnection()
        end = await _next(watcher)
        self.assertEqual((end["id"], end["status"], end["ok"]), ("act", 404, False))
        self.assertEqual(end["error"]["code"], "not_connected")
