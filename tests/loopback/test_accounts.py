"""Two players on one gateway (SPEC §12), over real sockets: scoping and reload."""

import os
from urllib.parse import quote

import orjson
import treq
from twisted.internet.defer import ensureDeferred
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.support import (
    JSON,
    account_table,
    accounts_file,
    both_modes,
    bounded,
    connect,
    reactor,
    start_gateway,
)
from trapsandbox.admission import accounts

ADMIN = "admin-token-1"


class TwoPlayersTests(TestCase):
    async def asyncSetUp(self):
        self.path = accounts_file(self, "alice", "bob")
        self.gateway = start_gateway(
            self,
            admin_token=ADMIN,
            accounts_file=self.path,
            accounts=accounts.load(self.path),
        )
        self.pool = HTTPConnectionPool(reactor(), persistent=False)
        self.computers = {}
        for name in ("alice", "bob"):
            computer = await connect(self, self.gateway.port)
            reply = await computer.hello(f"s-{name}", "1:")
            self.assertEqual(reply["payload"], {"accountId": name})
            self.computers[name] = computer

    async def http(self, method, path, token, body=None):
        response = await bounded(
            treq.request(
                method,
                f"http://127.0.0.1:{self.gateway.port}{path}",
                headers={"authorization": f"Bearer {token}", **JSON},
                data=None if body is None else orjson.dumps(body),
                pool=self.pool,
            )
        )
        return response.code, orjson.loads(await bounded(treq.content(response)))

    async def answer_one(self, computer):
        request = await computer.next_message()
        computer.respond(request, payload={"traposId": "1:", "who": computer.who})

    async def test_each_token_sees_and_reaches_its_own_only(self):
        await self.asyncSetUp()
        for name, computer in self.computers.items():
            computer.who = name
        for name in ("alice", "bob"):
            status, body = await self.http("GET", "/computers", f"token-{name}")
            self.assertEqual(
                [(c["accountId"], c["traposId"]) for c in body["computers"]], [(name, "1:")]
            )
            pending = self.http(
                "POST",
                f"/computers/{quote('1:', safe='')}/requests",
                f"token-{name}",
                {"type": "ping"},
            )
            d = ensureDeferred(pending)
            await self.answer_one(self.computers[name])
            status, body = await d
            self.assertEqual((status, body["payload"]["who"]), (200, name))

        # Another account's computer and a missing one answer alike, but for the id.
        for path in ("requests", "list-files"):
            body = {"type": "ping"} if path == "requests" else {"path": "/"}
            cross = await self.http(
                "POST", f"/computers/1%3A/{path}?account=bob", "token-alice", body
            )
            missing = await self.http("POST", f"/computers/9%3A/{path}", "token-alice", body)
            self.assertEqual(cross[0], 404)
            self.assertEqual(
                orjson.dumps(cross[1]).replace(b"1:", b"ID"),
                orjson.dumps(missing[1]).replace(b"9:", b"ID"),
            )
        status, _ = await self.http("GET", "/metrics", "token-alice")
        self.assertEqual(status, 403)
        status, body = await self.http("GET", "/computers/1%3A/screen", ADMIN)
        self.assertEqual((status, body["code"]), (409, "ambiguous"))

    async def test_reload_closes_a_removed_accounts_computers_only(self):
        await self.asyncSetUp()
        with open(self.path, "w") as f:
            f.write(account_table("alice", "s-alice"))
        self.assertTrue(self.gateway.accounts.reload())
        self.assertEqual(await self.computers["bob"].wait_closed(), (4001, "unauthorized"))
        status, body = await self.http("GET", "/computers", ADMIN)
        self.assertEqual([c["accountId"] for c in body["computers"]], ["alice"])
        self.assertFalse(self.computers["alice"].closed.called)
        # bob's token and secret no longer work; alice's computer still answers.
        self.assertEqual((await self.http("GET", "/computers", "token-bob"))[0], 401)
        again = await connect(self, self.gateway.port)
        self.assertEqual((await again.hello("s-bob", "1:"))["error"]["code"], "unauthorized")
        alice = self.computers["alice"]
        reply = await alice.request("probe_gateway")
        self.assertTrue(reply["ok"])

    async def test_a_bad_file_at_reload_keeps_the_accounts(self):
        await self.asyncSetUp()
        with open(self.path, "w") as f:
            f.write("[accounts.alice\n")
        self.assertFalse(self.gateway.accounts.reload())
        status, body = await self.http("GET", "/computers", "token-bob")
        self.assertEqual((status, len(body["computers"])), (200, 1))
        for computer in self.computers.values():
            self.assertFalse(computer.closed.called)

    async def test_max_computers(self):
        with open(self.path_for_limit(), "w") as f:
            f.write(account_table("alice", "s-alice") + "max_computers = 1\n")
        gateway = start_gateway(self, accounts=accounts.load(self.limit_path))
        first = await connect(self, gateway.port)
        self.assertTrue((await first.hello("s-alice", "1:"))["ok"])
        second = await connect(self, gateway.port)
        reply = await second.hello("s-alice", "2:")
        self.assertEqual(reply["error"]["code"], "overloaded")
        self.assertEqual(await second.wait_closed(), (4003, "too many computers"))
        # The same computer connecting again replaces itself: not one more.
        again = await connect(self, gateway.port)
        self.assertTrue((await again.hello("s-alice", "1:"))["ok"])
        self.assertEqual(await first.wait_closed(), (4000, "replaced"))

    def path_for_limit(self):
        self.limit_path = os.path.abspath(self.mktemp())
        return self.limit_path


both_modes(globals(), "TwoPlayersTests")
