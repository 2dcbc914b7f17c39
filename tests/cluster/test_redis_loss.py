"""
Redis killed under two real ``twistd`` gateways (issue 43): requests relayed at
that moment are answered 503 within seconds, and after Redis comes back a
connected computer is never answered 404 while the gateways write their
ownerships again.
"""

from __future__ import annotations

import signal
import time

import orjson
from twisted.internet.defer import Deferred, DeferredList
from twisted.trial.unittest import TestCase

from tests.cluster.helpers import Http, computer, ping, start_gateway, until
from tests.harness.redis import start_redis
from tests.harness.support import connect

# Each relayed request's own bound: far above "a few seconds", far below its 600 s.
ANSWER_BOUND = 20


class RedisLossTests(TestCase):
    timeout = 120

    async def test_requests_relayed_when_redis_dies_are_answered_503_within_seconds(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        at_a = await connect(self, a.port)
        self.assertTrue((await at_a.hello(trapos_id="4:busy"))["ok"])
        await at_a.request("capabilities", {"capabilities": ["eval"]})
        body = {"type": "eval", "payload": {"code": "sleep(60)"}, "timeoutMs": 600_000}
        answers = [
            Deferred.fromCoroutine(http.request(b, "4:busy", body, ANSWER_BOUND)) for _ in range(3)
        ]
        requests = [await at_a.next_message() for _ in range(3)]
        self.assertEqual({r["type"] for r in requests}, {"eval"})

        await redis.kill()
        started = time.monotonic()
        results = await DeferredList(answers, fireOnOneErrback=True, consumeErrors=True)
        elapsed = time.monotonic() - started
        for _, (code, content) in results:
            self.assertEqual((code, orjson.loads(content)["error"]["code"]), (503, "unavailable"))
        self.assertLess(elapsed, 5)

        # At A each one is cancelled on the computer; its answer, late, goes nowhere.
        cancels = [await at_a.next_message() for _ in range(3)]
        self.assertEqual({c["type"] for c in cancels}, {"cancel"})
        self.assertEqual(
            sorted(c["payload"]["messageId"] for c in cancels),
            sorted(r["messageId"] for r in requests),
        )
        for request in requests:
            at_a.respond(request, payload={"ok": True, "returns": [], "stdout": ""})
        for cancel in cancels:
            at_a.respond(cancel, payload={})
        # The computer keeps working where it is connected.
        local = Deferred.fromCoroutine(ping(http, a, "4:busy"))
        request = await at_a.next_message()
        self.assertEqual(request["type"], "ping")
        at_a.respond(request, payload={"traposId": "4:busy"})
        self.assertEqual((await local)[0], 200)
        self.assertFalse(at_a.closed.called)

    async def test_requests_relayed_to_a_gateway_killed_are_answered_503_within_seconds(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        at_a = await connect(self, a.port)
        self.assertTrue((await at_a.hello(trapos_id="4:doomed"))["ok"])
        await at_a.request("capabilities", {"capabilities": ["eval"]})
        body = {"type": "eval", "payload": {"code": "sleep(60)"}, "timeoutMs": 600_000}
        answers = [
            Deferred.fromCoroutine(http.request(b, "4:doomed", body, ANSWER_BOUND))
            for _ in range(2)
        ]
        for _ in answers:
            self.assertEqual((await at_a.next_message())["type"], "eval")

        a.child.signal("KILL")
        await a.child.wait_ended()
        started = time.monotonic()
        results = await DeferredList(answers, fireOnOneErrback=True, consumeErrors=True)
        for _, (code, content) in results:
            error = orjson.loads(content)["error"]
            self.assertEqual((code, error["code"]), (503, "unavailable"))
            self.assertIn("is gone", error["message"])
        self.assertLess(time.monotonic() - started, 5)

    async def test_after_redis_returns_a_connected_computer_is_never_404(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        await computer(self, a, "4:steady")
        self.assertEqual((await ping(http, b, "4:steady"))[0], 200)

        # A is the slower to come back: it cannot write its ownership again until it runs.
        a.child.signal("STOP")
        self.addCleanup(a.child.signal, signal.SIGCONT)
        await redis.kill()
        await redis.start()  # empty
        await b.child.wait_for(r"cluster: listening on[\s\S]*cluster: listening on", 15)
        pings = [Deferred.fromCoroutine(ping(http, b, "4:steady", ANSWER_BOUND)) for _ in range(8)]
        a.child.signal(signal.SIGCONT)
        results = await DeferredList(pings, fireOnOneErrback=True, consumeErrors=True)
        codes = [code for _, (code, _) in results]
        self.assertNotIn(404, codes)
        # 503 only if a relay raced A's inbox coming back; most are answered by the computer.
        self.assertLessEqual(set(codes), {200, 503})

        async def reachable():
            return (await ping(http, b, "4:steady", 5))[0] == 200

        await until(reachable, 10)
        self.assertEqual((await ping(http, b, "7:nowhere"))[0], 404)

    async def test_a_hello_while_redis_hangs_is_answered_within_its_bound(self):
        """
        The hello waits for the claim in Redis (SPEC §13), but never longer than every
        Redis call's bound: a Redis that stopped answering leaves the computer working
        where it connected.
        """
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        http = Http()
        redis.child.signal("STOP")
        self.addCleanup(redis.child.signal, signal.SIGCONT)
        started = time.monotonic()
        await computer(self, a, "4:patient")
        self.assertLess(time.monotonic() - started, 5)  # the bound is 2 s
        self.assertEqual((await ping(http, a, "4:patient"))[0], 200)
