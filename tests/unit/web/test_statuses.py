"""The HTTP status of each error code an operator request can end with (SPEC §4, §9, §16)."""

from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.computers import wire
from trapsandbox.web.operator import STATUS_OF_ERROR


class StatusOfErrorTests(SynchronousTestCase):
    def test_each_code_a_computer_or_the_gateway_answers_has_its_status(self):
        expected = {
            wire.BAD_REQUEST: 400,
            wire.FORBIDDEN: 403,
            wire.NOT_CONNECTED: 404,
            # The player stopped the agent (sandbox stop): only they can resume it.
            wire.STOPPED: 409,
            wire.TOO_LARGE: 413,
            wire.FS_ERROR: 422,
            # CraftOS refused a peripheral call or a turtle action: the computer answered.
            wire.PERIPHERAL_ERROR: 422,
            wire.UNKNOWN_TYPE: 501,
            wire.OVERLOADED: 503,
            wire.UNAVAILABLE: 503,
            wire.TIMEOUT: 504,
        }
        self.assertEqual({code: STATUS_OF_ERROR.get(code) for code in expected}, expected)
