"""The HTTP app in memory: /health, /client, JSON errors."""

import orjson
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from tests.harness.apps import gateway_app
from tests.harness.fakes import FixedProbe
from trapsandbox.computers.registry import Registry
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.web import client
from trapsandbox.web.site import GatewaySite


class WebTests(SynchronousTestCase):
    def setUp(self):
        self.registry = Registry(Clock())
        self.probe = FixedProbe(ProbeResult(False, "down"))
        self.http = StubTreq(gateway_app(self.registry, self.probe).resource())

    def get(self, path, headers=None):
        response = self.successResultOf(
            self.http.get("http://gw.example:4444" + path, headers=headers)
        )
        return response, self.successResultOf(self.http.content(response))

    def test_health(self):
        response, body = self.get("/health")
        self.assertEqual(response.code, 200)
        self.assertEqual(
            orjson.loads(body),
            {
                "sandboxOk": True,
                "opencodeOk": False,
                "opencodeDetail": "down",
                "computers": 0,
                "version": "0.1.0",
            },
        )

    def test_installer_names_this_gateway(self):
        response, body = self.get("/client/install.lua")
        self.assertEqual(response.code, 200)
        self.assertIn(b"local BASE_URL = 'http://gw.example:4444'\n", body)
        original = (client.lua_dir() / "install.lua").read_bytes()
        self.assertEqual(
            body.replace(b"http://gw.example:4444", b"__TRAPSANDBOX_BASE_URL__"), original
        )

    def test_installer_refuses_a_strange_host(self):
        response, body = self.get("/client/install.lua", headers={"host": "gw_x"})
        self.assertEqual(response.code, 400)
        self.assertEqual(orjson.loads(body)["error"]["code"], "bad_request")

    def test_client_files_are_the_tree_files(self):
        for name in client.FILES:
            response, body = self.get("/client/" + name)
            self.assertEqual(response.code, 200)
            self.assertEqual(body, (client.lua_dir() / name).read_bytes())

    def test_only_client_files_are_served(self):
        for path in ("/client/tests/sandbox.lua", "/client/../setup.cfg", "/client/apis/x.lua"):
            response, body = self.get(path)
            self.assertEqual(response.code, 404, path)
            self.assertEqual(orjson.loads(body)["error"]["code"], "not_found")

    def test_unknown_route_and_method_are_json(self):
        response, body = self.get("/nope")
        self.assertEqual((response.code, orjson.loads(body)["error"]["code"]), (404, "not_found"))
        response = self.successResultOf(self.http.post("http://gw.example:4444/health"))
        self.assertEqual(response.code, 405)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])

    def test_idle_http_connections_time_out(self):
        from trapsandbox.limits import HTTP_IDLE_TIMEOUT

        self.assertEqual(GatewaySite(Resource()).timeOut, HTTP_IDLE_TIMEOUT)
        self.assertLessEqual(HTTP_IDLE_TIMEOUT, 60)


class TextOnlyTests(SynchronousTestCase):
    """Klein's routes are text: what is not UTF-8 is answered as JSON, as every error is."""

    def exchange(self, target, host=b"127.0.0.1:4444"):
        app = gateway_app(Registry(Clock()))
        site = GatewaySite(app.resource(), decide=app.decide)
        site.reactor = Clock()
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        channel = site.buildProtocol(transport.getPeer())
        channel.makeConnection(transport)
        channel.dataReceived(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        head, _, body = transport.value().partition(b"\r\n\r\n")
        channel.connectionLost(None)
        self.assertIn(b"\r\nContent-Type: application/json", head)
        return int(head.split(b" ", 2)[1]), orjson.loads(body)["error"]

    def test_a_path_that_is_not_utf8_names_nothing(self):
        self.assertEqual(self.exchange(b"/%FF")[0], 404)
        for target in (b"/computers/%FF/screen", b"/computers/7%3A/%FE/screen"):
            self.assertEqual(
                self.exchange(target), (404, {"code": "not_found", "message": "no such computer"})
            )

    def test_a_host_that_is_not_utf8_is_a_bad_request(self):
        self.assertEqual(self.exchange(b"/health", host=b"\xff")[0], 400)
