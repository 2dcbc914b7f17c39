"""/metrics over loopback: the values move as computers connect, request and leave."""

import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool, ResponseNeverReceived

from tests.harness.callers import asking
from tests.harness.support import (
    both_modes,
    bounded,
    closed_port,
    connect,
    reactor,
    start_gateway,
)
from trapsandbox.errors import GatewayError
from trapsandbox.ops.metrics import Metrics

PASSWORD = "sesame"


def samples(text: str) -> dict:
    """``{(sample name, ((label, value), ...)): value}``"""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class MetricsTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password=PASSWORD)
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    async def scrape(self) -> dict:
        url = f"http://127.0.0.1:{self.gateway.port}/metrics"
        response = await bounded(treq.get(url, pool=self.pool))
        self.assertEqual(response.code, 200)
        [content_type] = response.headers.getRawHeaders("content-type")
        self.assertTrue(content_type.startswith("text/plain; version=0.0.4"), content_type)
        return samples((await bounded(treq.content(response))).decode("utf-8"))

    def value(self, scraped, name, **labels):
        return scraped.get((name, tuple(sorted(labels.items()))), 0.0)

    async def ready(self, trapos_id="7:"):
        computer = await connect(self, self.gateway.port)
        self.assertTrue((await computer.hello(PASSWORD, trapos_id))["ok"])
        return computer

    async def test_values_follow_computers(self):
        m = await self.scrape()
        self.assertEqual(self.value(m, "trapsandbox_computers_connected"), 0)
        self.assertEqual(self.value(m, "trapsandbox_connections_open"), 0)

        computer = await self.ready()
        intruder = await connect(self, self.gateway.port)
        await intruder.hello("guess")
        await intruder.wait_closed()
        m = await self.scrape()
        self.assertEqual(self.value(m, "trapsandbox_computers_connected"), 1)
        self.assertEqual(self.value(m, "trapsandbox_connections_open"), 1)
        self.assertEqual(self.value(m, "trapsandbox_hellos_total", outcome="ok"), 1)
        self.assertEqual(self.value(m, "trapsandbox_hellos_total", outcome="unauthorized"), 1)
        self.assertEqual(
            self.value(m, "trapsandbox_frames_received_total", event="computer_request"), 2
        )
        self.assertEqual(
            self.value(m, "trapsandbox_frames_sent_total", event="gateway_response"), 2
        )

        # Requests from the computer: handled, unknown, and junk.
        await computer.request("probe_gateway")
        await computer.request("teleport")
        computer.send(b"not json")
        await computer.request("health")
        m = await self.scrape()
        requests = "trapsandbox_computer_requests_total"
        self.assertEqual(self.value(m, requests, type="probe_gateway", outcome="ok"), 1)
        self.assertEqual(self.value(m, requests, type="health", outcome="ok"), 1)
        self.assertEqual(self.value(m, requests, type="other", outcome="unknown_type"), 1)
        self.assertEqual(self.value(m, requests, type="hello", outcome="unauthorized"), 1)
        self.assertEqual(self.value(m, "trapsandbox_frames_received_total", event="invalid"), 1)
        # Two health checks, two opencode probes: a failure is never reused.
        self.assertEqual(
            self.value(m, "trapsandbox_opencode_probes_total", outcome="unreachable"), 2
        )
        self.assertEqual(self.value(m, "trapsandbox_opencode_probe_seconds_count"), 2)

        # A request to the computer, in flight and then answered.
        d = self.gateway.registry.request(asking("7:"), "ping")
        sent = await computer.next_message()
        m = await self.scrape()
        self.assertEqual(self.value(m, "trapsandbox_gateway_requests_pending"), 1)
        computer.respond(sent, payload={"traposId": "7:"})
        await bounded(d)
        # One that times out, and one to nobody.
        late = self.gateway.registry.request(asking("7:"), "ping", timeout=0.05)
        await computer.next_message()
        await self.assertFailure(bounded(late), GatewayError)
        await self.assertFailure(self.gateway.registry.request(asking("9:"), "ping"), GatewayError)
        m = await self.scrape()
        self.assertEqual(self.value(m, "trapsandbox_gateway_requests_pending"), 0)
        gateway = "trapsandbox_gateway_requests_total"
        self.assertEqual(self.value(m, gateway, type="ping", outcome="ok"), 1)
        self.assertEqual(self.value(m, gateway, type="ping", outcome="timeout"), 1)
        self.assertEqual(self.value(m, gateway, type="ping", outcome="not_connected"), 1)
        # The refused one never went out: no latency for it.
        self.assertEqual(self.value(m, "trapsandbox_gateway_request_seconds_count"), 2)
        self.assertEqual(self.value(m, "trapsandbox_frames_sent_total", event="gateway_request"), 2)
        self.assertEqual(
            self.value(m, "trapsandbox_frames_received_total", event="computer_response"), 1
        )

        computer.sendClose(1000)
        await computer.wait_closed()
        m = await self.scrape()
        self.assertEqual(self.value(m, "trapsandbox_computers_connected"), 0)
        self.assertEqual(self.value(m, "trapsandbox_connections_open"), 0)

    async def test_operator_who_hangs_up_cancels_the_request(self):
        computer = await self.ready()
        counted = Deferred()
        count = self.gateway.metrics.gateway_request

        def observe(type, outcome, seconds):
            count(type, outcome, seconds)
            counted.callback(outcome)

        self.patch(self.gateway.metrics, "gateway_request", observe)
        url = f"http://127.0.0.1:{self.gateway.port}/computers/7%3A/requests"
        posted = treq.post(url, json={"type": "ping"}, pool=self.pool)
        await computer.next_message()
        posted.cancel()
        await self.assertFailure(posted, ResponseNeverReceived)
        self.assertEqual(await bounded(counted), "cancelled")
        self.assertEqual(self.gateway.registry.pending, 0)

    async def test_asks_and_opencode_instances_per_server_without_credentials(self):
        first, second = (f"http://127.0.0.1:{closed_port()}" for _ in range(2))
        with_secret = second.replace("http://", "http://oc:s3cret@")
        gateway = start_gateway(self, password=PASSWORD, opencode_url=f"{first},{with_secret}")
        url = f"http://127.0.0.1:{gateway.port}/metrics"
        response = await bounded(treq.get(url, pool=self.pool))
        text = (await bounded(treq.content(response))).decode("utf-8")
        self.assertNotIn("s3cret", text)
        m = samples(text)
        for server in (first, second):
            for name in (
                "trapsandbox_asks_waiting",
                "trapsandbox_asks_running",
                "trapsandbox_opencode_instances_live",
                "trapsandbox_opencode_instance_dispose_failures_total",
            ):
                self.assertEqual(m[(name, (("server", server),))], 0, (name, server))
            for reason in ("idle", "forgotten", "bound"):
                self.assertEqual(
                    m[
                        (
                            "trapsandbox_opencode_instances_given_back_total",
                            (("reason", reason), ("server", server)),
                        )
                    ],
                    0,
                )

    async def test_each_gateway_has_its_own_registry(self):
        other = start_gateway(self)
        await self.ready()
        self.assertEqual(
            other.metrics.registry.get_sample_value("trapsandbox_hellos_total", {"outcome": "ok"}),
            0,
        )
        self.assertEqual(
            self.gateway.metrics.registry.get_sample_value(
                "trapsandbox_hellos_total", {"outcome": "ok"}
            ),
            1,
        )


class LabelTests(SynchronousTestCase):
    def test_types_outside_the_handled_ones_share_one_label(self):
        metrics = Metrics()
        metrics.handle_types(["probe_gateway"])
        for kind in ("a", "b", "c"):
            metrics.computer_request(kind, "unknown_type")
        metrics.computer_request("probe_gateway", "ok")
        value = metrics.registry.get_sample_value
        self.assertEqual(
            value(
                "trapsandbox_computer_requests_total", {"type": "other", "outcome": "unknown_type"}
            ),
            3,
        )
        self.assertEqual(
            value(
                "trapsandbox_computer_requests_total", {"type": "probe_gateway", "outcome": "ok"}
            ),
            1,
        )


both_modes(globals(), "MetricsTests")
