"""Flow control towards one computer, on a fake clock."""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors
from trapsandbox.computers.outbound import Outbound
from trapsandbox.errors import GatewayError


class OutboundTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.written = []
        self.stalls = []
        self.outbound = Outbound(
            self.written.append,
            lambda: self.stalls.append(self.clock.seconds()),
            self.clock,
            max_queued=10,
            stall_timeout=30,
        )

    def test_writes_straight_through_when_flowing(self):
        self.outbound.send(b"abc")
        self.assertEqual(self.written, [b"abc"])
        self.assertEqual(self.outbound.queued_bytes, 0)

    def test_queues_while_paused_and_flushes_in_order(self):
        self.outbound.pauseProducing()
        self.outbound.send(b"1234")
        self.outbound.send(b"5678")
        self.assertEqual(self.written, [])
        self.assertEqual(self.outbound.queued_bytes, 8)
        self.outbound.resumeProducing()
        self.assertEqual(self.written, [b"1234", b"5678"])
        self.assertEqual(self.outbound.queued_bytes, 0)

    def test_keeps_no_queue_while_none_is_needed(self):
        # One Outbound per computer: an empty deque would cost 0.6 kB each.
        self.assertIsNone(self.outbound._queue)
        self.assertFalse(hasattr(self.outbound, "__dict__"))
        self.outbound.send(b"flowing")
        self.assertIsNone(self.outbound._queue)
        self.outbound.pauseProducing()
        self.outbound.send(b"1")
        self.outbound.resumeProducing()
        self.assertIsNone(self.outbound._queue)
        self.outbound.pauseProducing()
        self.outbound.send(b"2")
        self.outbound.send(b"3")
        self.outbound.stopProducing()
        self.assertIsNone(self.outbound._queue)
        self.assertEqual(self.written, [b"flowing", b"1"])

    def test_nothing_overtakes_the_queue(self):
        self.outbound.pauseProducing()
        self.outbound.send(b"one")
        self.outbound.paused = False  # resumed, but the queue not yet flushed
        self.outbound.send(b"two")
        self.assertEqual(self.written, [])
        self.outbound.resumeProducing()
        self.assertEqual(self.written, [b"one", b"two"])

    def test_over_the_bound_fails_at_once(self):
        self.outbound.pauseProducing()
        self.outbound.send(b"123456")
        with self.assertRaises(GatewayError) as caught:
            self.outbound.send(b"12345")
        self.assertEqual(caught.exception.code, errors.OVERLOADED)
        self.assertEqual(self.outbound.queued_bytes, 6)
        self.outbound.send(b"1234")  # still fits

    def test_a_write_that_pauses_stops_the_flush(self):
        self.outbound.pauseProducing()
        for data in (b"a", b"b", b"c"):
            self.outbound.send(data)

        def write(data):
            self.written.append(data)
            self.outbound.pauseProducing()

        self.outbound._write = write
        self.outbound.resumeProducing()
        self.assertEqual(self.written, [b"a"])
        self.assertEqual(self.outbound.queued_bytes, 2)

    def test_stalled_after_the_timeout(self):
        self.outbound.pauseProducing()
        self.clock.advance(29)
        self.assertEqual(self.stalls, [])
        self.clock.advance(1)
        self.assertEqual(self.stalls, [30])

    def test_resume_cancels_the_stall_timer(self):
        self.outbound.pauseProducing()
        self.clock.advance(20)
        self.outbound.resumeProducing()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.outbound.pauseProducing()
        self.clock.advance(29)
        self.assertEqual(self.stalls, [])

    def test_stop_clears(self):
        self.outbound.pauseProducing()
        self.outbound.send(b"abc")
        self.outbound.stopProducing()
        self.assertEqual(self.outbound.queued_bytes, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
