"""Two and three real ``twistd`` gateways sharing one real Redis (SPEC §13)."""

from __future__ import annotations

import orjson
from twisted.trial.unittest import TestCase

from tests.cluster.helpers import Http, start_gateway, until
from tests.harness.redis import start_redis
from tests.harness.support import connect


class ClusterTests(TestCase):
    timeout = 60

    async def test_cross_routing(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        computer = await connect(self, a.port)
        self.assertTrue((await computer.hello(trapos_id="1:a"))["ok"])

        async def ping_from_b():
            return await http.request(b, "1:a", {"type": "ping"})

        from twisted.internet.defer import Deferred

        answer = Deferred.fromCoroutine(ping_from_b())
        request = await computer.next_message()
        self.assertEqual((request["event"], request["type"]), ("gateway_request", "ping"))
        computer.respond(request, payload={"traposId": "1:a"})
        code, body = await answer
        self.assertEqual(
            (code, orjson.loads(body)), (200, {"ok": True, "payload": {"traposId": "1:a"}})
        )

        code, listed = await http.get(b, "/computers")
        self.assertEqual(code, 200)
        self.assertEqual(
            [(c["traposId"], c["gateway"]) for c in listed["computers"]], [("1:a", a.instance)]
        )

        async def health_counts():
            _, health = await http.get(b, "/health")
            return health["gateways"] == 2 and health["computers"] == 1 and health["redisOk"]

        await until(health_counts)
