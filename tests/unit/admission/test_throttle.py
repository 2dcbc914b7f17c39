"""Failure throttling per address, on a fake clock."""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.admission.throttle import FailureThrottle


class ThrottleTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.throttle = FailureThrottle(self.clock, free_failures=3, base_block=2, max_block=60)

    def fail_times(self, n, address="10.0.0.1"):
        return [self.throttle.failed(address) for _ in range(n)]

    def test_free_failures_do_not_block(self):
        self.assertEqual(self.fail_times(3), [(0.0, False)] * 3)
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 0)

    def test_blocks_grow_and_are_capped(self):
        results = self.fail_times(10)
        blocks = [block for block, _ in results[3:]]
        self.assertEqual(blocks, [2, 4, 8, 16, 32, 60, 60])
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 60)

    def test_block_expires(self):
        self.fail_times(4)
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 2)
        self.clock.advance(1.5)
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 0.5)
        self.clock.advance(0.5)
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 0)

    def test_other_addresses_are_not_affected(self):
        self.fail_times(10)
        self.assertEqual(self.throttle.blocked_for("10.0.0.2"), 0)

    def test_warns_once_per_period(self):
        warnings = [warn for _, warn in self.fail_times(10)]
        self.assertEqual(warnings.count(True), 1)
        self.clock.advance(61)
        self.assertTrue(self.throttle.failed("10.0.0.1")[1])

    def test_quiet_addresses_are_forgotten(self):
        self.fail_times(5)
        self.clock.advance(self.throttle.forget_after + 1)
        self.assertEqual(self.throttle.blocked_for("10.0.0.1"), 0)
        self.assertEqual(self.throttle.failed("10.0.0.1"), (0.0, False))

    def test_table_is_bounded(self):
        throttle = FailureThrottle(self.clock, max_addresses=100)
        for i in range(1000):
            self.clock.advance(0.001)
            throttle.failed(f"10.0.{i // 256}.{i % 256}")
        self.assertLessEqual(len(throttle), 100)
        # The newest are kept.
        self.assertIn("10.0.3.231", throttle._records)
