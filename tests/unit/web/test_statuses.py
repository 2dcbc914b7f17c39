"""The HTTP status of each error code an operator request can end with (SPEC §4, §9, §16)."""

from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors


class StatusOfErrorTests(SynchronousTestCase):
    def test_each_code_a_computer_or_the_gateway_answers_has_its_status(self):
        expected = {
            errors.BAD_REQUEST: 400,
            errors.FORBIDDEN: 403,
            errors.NOT_CONNECTED: 404,
            # The player stopped the agent (sandbox stop): only they can resume it.
            errors.STOPPED: 409,
            errors.TOO_LARGE: 413,
            errors.FS_ERROR: 422,
            # CraftOS refused a peripheral call or a turtle action: the computer answered.
            errors.PERIPHERAL_ERROR: 422,
            errors.UNKNOWN_TYPE: 501,
            errors.OVERLOADED: 503,
            errors.UNAVAILABLE: 503,
            errors.TIMEOUT: 504,
        }
        self.assertEqual({code: errors.STATUS.get(code) for code in expected}, expected)
