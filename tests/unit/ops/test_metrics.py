"""The metrics counted in plain integers export what prometheus_client's own would."""

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.ops.metrics import GATEWAY_BUCKETS, Durations


def exposition(registry):
    # prometheus_client adds a _created sample the plain collector has no use for.
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if "_created" not in line]


class DurationsTests(SynchronousTestCase):
    @given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False)))
    def test_the_same_exposition_as_a_prometheus_histogram(self, values):
        ours, theirs = CollectorRegistry(), CollectorRegistry()
        durations = Durations("x_seconds", "how long", GATEWAY_BUCKETS)
        ours.register(durations)
        histogram = Histogram("x_seconds", "how long", buckets=GATEWAY_BUCKETS, registry=theirs)
        for value in [*values, *GATEWAY_BUCKETS]:  # every bound itself, too
            durations.observe(value)
            histogram.observe(value)
        self.assertEqual(exposition(ours), exposition(theirs))
