"""
opencode's HTTP API (``opencode.client``): a failed call is an
``opencode_error`` that says what to do, seen through an ask.
"""

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import AskTestsMixin
from trapsandbox import limits
from trapsandbox.errors import GatewayError


class ClientFaultTests(AskTestsMixin, SynchronousTestCase):
    def test_opencode_down_for_a_call(self):
        self.http.answers[("POST", "/session")] = ConnectionRefusedError()
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("connection refused: is opencode running?", error.message)

    def test_401_on_a_call(self):
        self.http.answers[("GET", "/config")] = (401, None)
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("401 Unauthorized", error.message)
        self.assertEqual(self.http.sessions, 0)

    def test_another_http_error_names_the_call_and_opencodes_message(self):
        self.http.answers[("POST", "/session")] = (400, {"data": {"message": "bad rule"}})
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("HTTP 400 to POST /session: bad rule", error.message)

    def test_an_unanswered_call_times_out(self):
        self.http.answers[("POST", "/session")] = Deferred()
        d = self.ask()
        self.clock.advance(limits.ASK_CALL_TIMEOUT)
        self.assertIn("no answer in time", self.failureResultOf(d, GatewayError).value.message)
