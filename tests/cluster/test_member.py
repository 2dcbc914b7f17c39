"""The member as a whole without Redis, its settings, and one process that imports none of it."""

from __future__ import annotations

import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.harness.callers import asking
from tests.harness.processes import REPO
from tests.harness.support import closed_port
from trapsandbox import config, errors
from trapsandbox.cluster import member as cluster
from trapsandbox.cluster.redis import RedisAddress
from trapsandbox.errors import ConfigError


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
            await registry.request(asking("1:far"), "ping")
        except errors.GatewayError as error:
            failure = error
        self.assertEqual(failure.code, errors.UNAVAILABLE)
        self.assertEqual(member.health(0), {"computers": 0, "gateways": 1, "redisOk": False})
        self.assertEqual(member.size, 1)


class SettingsTests(SynchronousTestCase):
    def test_redis_url(self):
        settings = config.load({"SANDBOX_REDIS_URL": "redis://:pw@10.0.0.5:6380/2"})
        self.assertEqual(settings.redis_url, "redis://:pw@10.0.0.5:6380/2")
        self.assertNotIn("pw", repr(settings))
        address = RedisAddress.from_url(settings.redis_url)
        self.assertEqual(
            (address.host, address.port, address.db, address.password),
            ("10.0.0.5", 6380, 2, "pw"),
        )
        self.assertEqual(RedisAddress.from_url("redis://h").port, 6379)
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
            f"g = trapsandbox.tap.build(config.Settings(state_dir={state!r}), reactor)\n"
            "assert g.cluster is None and g.registry.peers is None\n"
            "assert 'txredisapi' not in sys.modules\n"
            "assert 'trapsandbox.cluster.member' not in sys.modules\n"
            "assert not [m for m in sys.modules if m.startswith('trapsandbox.cluster.')]\n"
        )
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=30)
