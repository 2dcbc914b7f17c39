"""The cluster's Lua scripts against a real redis-server: their semantics, one by one."""

from __future__ import annotations

import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.harness.processes import REPO
from tests.harness.redis import redis_client, start_redis
from tests.harness.support import closed_port
from trapsandbox import config
from trapsandbox.cluster import member as cluster
from trapsandbox.cluster.member import CLAIM, HEARTBEAT, LEAVE, REFRESH, RELEASE
from trapsandbox.computers import wire
from trapsandbox.errors import ConfigError

OWNER, EPOCH = "t:owner:k", "t:epoch:k"


class ScriptTests(TestCase):
    timeout = 30

    async def redis(self):
        server = await start_redis(self)
        return await redis_client(self, server)

    async def test_claim_increments_the_epoch_and_names_the_previous_owner(self):
        r = await self.redis()
        self.assertEqual(await r.eval(CLAIM, [EPOCH, OWNER], ["a", 60000]), [1, ""])
        self.assertEqual(await r.eval(CLAIM, [EPOCH, OWNER], ["b", 60000]), [2, "a|1"])
        self.assertEqual(await r.get(OWNER), "b|2")
        self.assertTrue(0 < await r.execute_command("PTTL", OWNER) <= 60000)
        # The same process again (a newer connection of its own): still a new epoch.
        self.assertEqual(await r.eval(CLAIM, [EPOCH, OWNER], ["b", 60000]), [3, "b|2"])

    async def test_refresh_renews_ours_and_reports_taken_keys(self):
        r = await self.redis()
        await r.eval(CLAIM, [EPOCH, OWNER], ["a", 1000])
        await r.eval(CLAIM, ["t:epoch:j", "t:owner:j"], ["b", 1000])
        reply = await r.eval(REFRESH, [OWNER, EPOCH, "t:owner:j", "t:epoch:j"], ["a", 90000, 1, 1])
        self.assertEqual(reply, [1, 0])
        self.assertGreater(await r.execute_command("PTTL", OWNER), 1000)
        self.assertEqual(await r.get("t:owner:j"), "b|1")  # not touched

    async def test_refresh_reclaims_a_lost_key_and_raises_the_counter(self):
        r = await self.redis()
        # Redis restarted empty while we hold epoch 7: the key and counter are gone.
        self.assertEqual(await r.eval(REFRESH, [OWNER, EPOCH], ["a", 60000, 7]), [1])
        self.assertEqual((await r.get(OWNER), await r.get(EPOCH)), ("a|7", "7"))
        self.assertEqual(await r.eval(CLAIM, [EPOCH, OWNER], ["b", 60000]), [8, "a|7"])

    async def test_refresh_does_not_reclaim_past_a_newer_hello(self):
        r = await self.redis()
        await r.set(EPOCH, "9")  # a newer hello came and went (its key released or expired)
        self.assertEqual(await r.eval(REFRESH, [OWNER, EPOCH], ["a", 60000, 7]), [0])
        self.assertIsNone(await r.get(OWNER))
        self.assertEqual(await r.get(EPOCH), "9")

    async def test_release_is_compare_and_delete(self):
        r = await self.redis()
        await r.eval(CLAIM, [EPOCH, OWNER], ["a", 60000])
        await r.eval(CLAIM, [EPOCH, OWNER], ["b", 60000])
        self.assertEqual(await r.eval(RELEASE, [OWNER], ["a|1"]), 0)
        self.assertEqual(await r.get(OWNER), "b|2")
        self.assertEqual(await r.eval(RELEASE, [OWNER], ["b|2"]), 1)
        self.assertIsNone(await r.get(OWNER))
        self.assertEqual(await r.get(EPOCH), "2")  # the fencing token stays

    async def test_heartbeat_lists_the_live_and_prunes_the_dead(self):
        r = await self.redis()
        beat = ["t:instances"]
        self.assertEqual(await r.eval(HEARTBEAT, beat, ["a", "A", 60000, "t:i:"]), ["A"])
        self.assertEqual(
            sorted(await r.eval(HEARTBEAT, beat, ["b", "B", 60000, "t:i:"])), ["A", "B"]
        )
        await r.delete("t:i:a")  # a's heartbeat expired
        self.assertEqual(await r.eval(HEARTBEAT, beat, ["b", "B", 60000, "t:i:"]), ["B"])
        self.assertEqual(await r.smembers("t:instances"), {"b"})
        self.assertTrue(0 < await r.execute_command("PTTL", "t:i:b") <= 60000)
        self.assertEqual(await r.eval(LEAVE, ["t:instances", "t:i:b"], ["b"]), 1)
        self.assertEqual(await r.smembers("t:instances"), set())


class WithoutRedisTests(TestCase):
    timeout = 20

    async def test_requests_for_elsewhere_fail_at_once_while_redis_is_away(self):
        from twisted.internet import reactor

        from trapsandbox.computers.registry import Registry

        registry = Registry(reactor)
        member = cluster.Cluster(
            registry, f"redis://127.0.0.1:{closed_port()}/0", reactor, lambda s: {}
        )
        registry.peers = member
        member.start()
        self.addCleanup(member.stop)
        failure = None
        try:
            await registry.request("1:far", "ping")
        except wire.GatewayError as error:
            failure = error
        self.assertEqual(failure.code, wire.UNAVAILABLE)
        self.assertEqual(member.health(0), {"computers": 0, "gateways": 1, "redisOk": False})
        self.assertEqual(member.size, 1)


class SettingsTests(SynchronousTestCase):
    def test_redis_url(self):
        settings = config.load({"SANDBOX_REDIS_URL": "redis://:pw@10.0.0.5:6380/2"})
        self.assertEqual(settings.redis_url, "redis://:pw@10.0.0.5:6380/2")
        self.assertNotIn("pw", repr(settings))
        address = cluster.RedisAddress.from_url(settings.redis_url)
        self.assertEqual(
            (address.host, address.port, address.db, address.password),
            ("10.0.0.5", 6380, 2, "pw"),
        )
        self.assertEqual(cluster.RedisAddress.from_url("redis://h").port, 6379)
        self.assertIsNone(config.load({}).redis_url)
        self.assertIsNone(config.load({"SANDBOX_REDIS_URL": ""}).redis_url)
        self.assertEqual(
            config.load({}, {"redis": "redis://h/1", "redis-refresh-ms": "500"}),
            config.Settings(redis_url="redis://h/1", cluster_refresh_interval=0.5),
        )
        for bad in ("http://h", "redis://:pw@/0", "redis://h/x", "redis://h/1/2"):
            with self.assertRaises(ConfigError) as raised:
                config.load({"SANDBOX_REDIS_URL": bad})
            self.assertNotIn("pw", str(raised.exception))

    def test_one_process_imports_nothing_of_it(self):
        state = os.path.abspath(self.mktemp())
        code = (
            "import sys, trapsandbox.tap\n"
            "from twisted.internet import reactor\n"
            "from trapsandbox import config\n"
            f"g = trapsandbox.tap.GatewayService(config.Settings(state_dir={state!r}), reactor)\n"
            "assert g.cluster is None and g.registry.peers is None\n"
            "assert 'txredisapi' not in sys.modules\n"
            "assert 'trapsandbox.cluster.member' not in sys.modules\n"
        )
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=30)
