"""Two and three real ``twistd`` gateways sharing one real Redis (SPEC §13)."""

from __future__ import annotations

import time

import orjson
from twisted.internet.defer import Deferred, DeferredList, DeferredSemaphore
from twisted.trial.unittest import TestCase

from tests.cluster.helpers import Http, computer, ping, start_gateway, until
from tests.harness.rawhttp import events, raw
from tests.harness.redis import redis_client, start_redis
from tests.harness.support import connect
from tests.loopback.test_live import FIRST


class ClusterTests(TestCase):
    timeout = 120

    async def test_cross_routing(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        at_a = await connect(self, a.port)
        self.assertTrue((await at_a.hello(trapos_id="1:a"))["ok"])

        answer = Deferred.fromCoroutine(http.request(b, "1:a", {"type": "ping"}))
        request = await at_a.next_message()
        self.assertEqual((request["event"], request["type"]), ("gateway_request", "ping"))
        at_a.respond(request, payload={"traposId": "1:a"})
        code, body = await answer
        self.assertEqual(
            (code, orjson.loads(body)), (200, {"ok": True, "payload": {"traposId": "1:a"}})
        )
        # An answer with ok false crosses as it is, and an unknown computer is a 404.
        answer = Deferred.fromCoroutine(http.request(b, "1:a", {"type": "odd"}))
        request = await at_a.next_message()
        at_a.respond(request, ok=False, error={"code": "unknown_type", "message": "no"})
        code, body = await answer
        self.assertEqual(
            (code, orjson.loads(body)["error"]), (200, {"code": "unknown_type", "message": "no"})
        )
        code, _ = await ping(http, b, "2:nobody")
        self.assertEqual(code, 404)

        code, listed = await http.get(b, "/computers")
        self.assertEqual(code, 200)
        self.assertEqual(
            [(c["traposId"], c["gateway"]) for c in listed["computers"]], [("1:a", a.instance)]
        )

        async def health_counts():
            _, health = await http.get(b, "/health")
            return health["gateways"] == 2 and health["computers"] == 1 and health["redisOk"]

        await until(health_counts)
        _, metrics = await http.get_text(b, "/metrics")
        self.assertIn("trapsandbox_cluster_gateways 2.0", metrics)

    async def test_mcp_tools_reach_a_computer_on_another_process(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        at_a = await connect(self, a.port)
        self.assertTrue((await at_a.hello(trapos_id="4:far"))["ok"])
        await at_a.request("capabilities", {"capabilities": ["eval"]})
        listed = await http.mcp(b, "tools/call", {"name": "list_computers", "arguments": {}})
        self.assertIn("4:far", listed["content"][0]["text"])
        call = Deferred.fromCoroutine(
            http.mcp(
                b,
                "tools/call",
                {"name": "run_lua", "arguments": {"computer": "far", "code": "return 6*7"}},
            )
        )
        request = await at_a.next_message()
        self.assertEqual((request["type"], request["payload"]["code"]), ("eval", "return 6*7"))
        answer = {"ok": True, "returns": ["42"], "stdout": "", "durationMs": 1, "timedOut": False}
        at_a.respond(request, payload=answer)
        result = await call
        self.assertNotIn("isError", result)
        self.assertIn("Returned: 42", result["content"][0]["text"])

    async def test_partial_responses_cross(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        at_a = await connect(self, a.port)
        await at_a.hello(trapos_id="3:runner")
        await at_a.request("capabilities", {"capabilities": ["exec"]})
        answer = Deferred.fromCoroutine(
            http.request(b, "3:runner", {"command": "ls"}, path="execute")
        )
        request = await at_a.next_message()
        self.assertEqual(request["type"], "exec")
        at_a.respond(request, partial=True, payload={"type": "stdout_delta", "data": "one\n"})
        at_a.respond(request, payload={"exitCode": 0, "timedOut": False, "stdout": "one\ntwo\n"})
        code, body = await answer
        lines = [orjson.loads(line) for line in body.splitlines()]
        self.assertEqual(code, 200)
        self.assertEqual(
            lines,
            [
                {"type": "stdout_delta", "data": "one\n"},
                {"type": "stdout_delta", "data": "two\n"},
                {"type": "result", "exitCode": 0, "timedOut": False},
            ],
        )

    async def test_a_screen_watch_crosses_and_a_caller_leaving_cancels_it(self):
        """
        SPEC §13, §14: a watch opened at one process on a computer held by the other streams
        its frames (expanded) like any partials, and the caller leaving ends the watch on
        the computer.
        """
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        at_a = await connect(self, a.port)
        await at_a.hello(trapos_id="3:screen")
        await at_a.request("capabilities", {"capabilities": ["screen"]})
        watch_head = b"GET /computers/3%3Ascreen/screen/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        caller = await raw(self, b.port, watch_head)
        watch = await at_a.next_message()
        self.assertEqual(watch["type"], "screen_watch")
        # (Relayed, the response head comes with the first frame.)
        at_a.respond(watch, payload=FIRST, partial=True)
        self.assertIn(b" 200 ", (await caller.until(b"\r\n\r\n")).split(b"\r\n")[0])
        (first,) = events(await caller.until(b"}\n\n"))
        self.assertEqual(first["rows"]["1"]["line"], "> a   ")
        later = {"type": "screen", "cursorX": 2, "cursorY": 2, "rows": {"2": {"line": "x"}}}
        at_a.respond(watch, payload=later, partial=True)
        (second,) = events(await caller.until(b"}\n\n"))
        self.assertEqual((second["rows"]["2"]["line"], second["cursorY"]), ("xxxxxx", 2))
        caller.transport.loseConnection()
        cancel = await at_a.next_message()
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": watch["messageId"]})
        )

    async def test_simultaneous_hellos_one_survives_the_higher_epoch(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        to_a = await connect(self, a.port)
        to_b = await connect(self, b.port)
        replies = await DeferredList(
            [to_a.hello(trapos_id="5:twin"), to_b.hello(trapos_id="5:twin")],
            fireOnOneErrback=True,
        )
        self.assertTrue(all(reply["ok"] for _, reply in replies))
        closed = await DeferredList(
            [to_a.closed, to_b.closed], fireOnOneCallback=True, fireOnOneErrback=True
        ).addTimeout(10, _reactor())
        (code, reason), index = closed
        self.assertEqual((code, reason), (4000, "replaced"))
        survivor, gateway = [(to_b, b), (to_a, a)][index]
        self.assertFalse(survivor.closed.called)
        client = await redis_client(self, redis)
        owner = await client.get('trapsandbox:owner:["local","5:twin"]')
        self.assertEqual(owner, f"{gateway.instance}|2")
        self.assertEqual(await client.get('trapsandbox:epoch:["local","5:twin"]'), "2")
        # The survivor stays, reachable from both.
        http = Http()
        for each in (a, b):
            self.assertEqual((await ping_answering(http, each, survivor, "5:twin"))[0], 200)
        self.assertFalse(survivor.closed.called)

    async def test_kill_of_an_owner(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        c = await start_gateway(self, redis.url)
        http = Http()
        await computer(self, a, "8:moving")
        self.assertEqual((await ping(http, b, "8:moving"))[0], 200)

        a.child.signal("KILL")
        await a.child.wait_ended()
        started = time.monotonic()
        code, body = await ping(http, b, "8:moving")
        self.assertEqual((code, body["error"]["code"]), (503, "unavailable"))
        self.assertLess(time.monotonic() - started, 1.0)

        # The computer reconnects through the load balancer, to C: reachable from B at once.
        await computer(self, c, "8:moving")
        self.assertEqual(await ping(http, b, "8:moving"), (200, _pong("8:moving")))

        # Gone for good: 404 once its key expires (3 refreshes).
        await computer(self, c, "9:gone")
        kill_c = c.child
        kill_c.signal("KILL")
        await kill_c.wait_ended()

        async def not_found():
            return (await ping(http, b, "9:gone"))[0] == 404

        await until(not_found, 10)

    async def test_redis_killed_and_restarted_empty(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        await computer(self, a, "4:steady")
        self.assertEqual((await ping(http, b, "4:steady"))[0], 200)

        await redis.kill()
        started = time.monotonic()
        code, body = await ping(http, b, "4:steady")
        self.assertEqual((code, body["error"]["code"]), (503, "unavailable"))
        self.assertLess(time.monotonic() - started, 3.0)
        # Local computers are not affected; /health answers, and says so.
        self.assertEqual(await ping(http, a, "4:steady"), (200, _pong("4:steady")))
        code, health = await http.get(b, "/health", 3)
        self.assertEqual((code, health["redisOk"], health["gateways"]), (200, False, 1))
        await computer(self, a, "6:during")  # a hello while Redis is down works locally

        await redis.start()  # same port, empty

        async def reachable():
            return (await ping(http, b, "4:steady", 5))[0] == 200

        started = time.monotonic()
        await until(reachable, 15)
        await until(lambda: Deferred.fromCoroutine(_code(http, b, "6:during", 200)), 10)
        self.assertLess(time.monotonic() - started, 10)
        client = await redis_client(self, redis)
        self.assertGreaterEqual(int(await client.get('trapsandbox:epoch:["local","4:steady"]')), 1)

    async def test_a_thousand_computers_over_two_gateways(self):
        redis = await start_redis(self)
        gateways = [await start_gateway(self, redis.url) for _ in range(2)]
        http = Http()
        limit = DeferredSemaphore(50)
        ids = [f"{n}:many" for n in range(1000)]

        async def join(n: int, trapos_id: str):
            await computer(self, gateways[n % 2], trapos_id)

        started = time.monotonic()
        await DeferredList(
            [
                limit.run(lambda n=n, t=t: Deferred.fromCoroutine(join(n, t)))
                for n, t in enumerate(ids)
            ],
            fireOnOneErrback=True,
        )
        joined = time.monotonic() - started

        async def answered(gateway, trapos_id):
            self.assertEqual(await ping(http, gateway, trapos_id, 20), (200, _pong(trapos_id)))

        started = time.monotonic()
        await DeferredList(
            [
                limit.run(lambda g=g, t=t: Deferred.fromCoroutine(answered(g, t)))
                for g in gateways
                for t in ids
            ],
            fireOnOneErrback=True,
        )
        pinged = time.monotonic() - started
        self.assertLess(joined + pinged, 90)
        for gateway in gateways:
            _, listed = await http.get(gateway, "/computers", 20)
            self.assertEqual(len(listed["computers"]), 1000)
            self.assertNotIn("unreachableGateways", listed)


def _reactor():
    from twisted.internet import reactor

    return reactor


def _pong(trapos_id: str) -> dict:
    return {"ok": True, "payload": {"traposId": trapos_id}}


async def _code(http, gateway, trapos_id, expected):
    return (await ping(http, gateway, trapos_id, 5))[0] == expected


async def ping_answering(http, gateway, connected, trapos_id):
    """A ping through ``gateway`` that ``connected`` (a plain test computer) answers."""
    answer = Deferred.fromCoroutine(ping(http, gateway, trapos_id))
    request = await connected.next_message()
    connected.respond(request, payload={"traposId": trapos_id})
    return await answer
