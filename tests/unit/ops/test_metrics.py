"""The metrics counted in plain integers export what prometheus_client's own would."""

import attrs
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.ops.metrics import GATEWAY_BUCKETS, Durations, Metrics, ServerFigures


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


class AskServerMetricsTests(SynchronousTestCase):
    def test_figures_per_server_are_read_when_scraped_and_a_new_watch_replaces_the_old(self):
        metrics = Metrics()
        figures = [
            ServerFigures("http://a:4096", 3, 2, 7, {"idle": 4, "bound": 1}, 2),
            ServerFigures("http://b:4096", 0, 0, 0, {"idle": 0, "bound": 0}, 0),
        ]
        metrics.watch_asks(lambda: figures)
        value = metrics.registry.get_sample_value
        a, b = {"server": "http://a:4096"}, {"server": "http://b:4096"}
        self.assertEqual(value("trapsandbox_asks_waiting", a), 3)
        self.assertEqual(value("trapsandbox_asks_running", a), 2)
        self.assertEqual(value("trapsandbox_opencode_instances_live", a), 7)
        self.assertEqual(
            value("trapsandbox_opencode_instances_given_back_total", {**a, "reason": "idle"}), 4
        )
        self.assertEqual(value("trapsandbox_opencode_instance_dispose_failures_total", a), 2)
        self.assertEqual(value("trapsandbox_asks_waiting", b), 0)
        figures[0] = attrs.evolve(figures[0], waiting=1)
        self.assertEqual(value("trapsandbox_asks_waiting", a), 1)
        metrics.watch_asks(lambda: figures[1:])
        self.assertIsNone(value("trapsandbox_asks_waiting", a))
        self.assertEqual(value("trapsandbox_asks_waiting", b), 0)
        generate_latest(metrics.registry)  # every family exports
