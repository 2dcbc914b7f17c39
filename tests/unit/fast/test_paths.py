"""``fast.paths``: nothing patched at import; ``install`` patches, ``uninstall`` puts back."""

import autobahn.websocket.protocol
from autobahn.twisted.websocket import WebSocketServerFactory
from twisted.internet import epollreactor, tcp
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import config
from trapsandbox.errors import ConfigError
from trapsandbox.fast import patches, paths
from trapsandbox.fast.front import FrontFactory
from trapsandbox.fast.protocols import FastGatewayProtocol, FastOperatorSocket
from trapsandbox.web.listener import CountedSite


def _library() -> dict:
    """The library names the fast paths replace, as they are now."""
    return {
        "write": vars(tcp.Server).get("write"),
        "log": epollreactor.log,
        "poll": epollreactor.EPollReactor.doPoll,
        "iteration": epollreactor.EPollReactor.doIteration,
        "masker": autobahn.websocket.protocol.create_xor_masker,
        "validator": autobahn.websocket.protocol.Utf8Validator,
        "pformat": autobahn.websocket.protocol.pformat,
    }


class InstallTests(SynchronousTestCase):
    def setUp(self):
        paths.uninstall()
        self.shipped = _library()
        self.addCleanup(paths.uninstall)

    def test_install_patches_and_uninstall_puts_the_libraries_back(self):
        self.assertIsNone(self.shipped["write"])  # Twisted's own is inherited
        paths.install()
        patched = _library()
        self.assertIs(patched["write"], patches._write_through)
        for name, value in patched.items():
            self.assertIsNot(value, self.shipped[name], name)
        paths.install()  # twice: still undone in one step
        paths.uninstall()
        self.assertEqual(_library(), self.shipped)

    def test_without_patches_nothing_is_patched(self):
        fast = paths.install(["patches"])
        self.assertEqual(_library(), self.shipped)
        self.assertEqual(fast.parts, ("front", "fasthttp", "frames"))

    def test_an_unknown_part_is_a_clear_error(self):
        with self.assertRaises(ConfigError) as raised:
            paths.install(["frmaes"])
        self.assertIn("no such fast path frmaes", str(raised.exception))


class ChoiceTests(SynchronousTestCase):
    """What ``GatewayService`` is given to serve with, by mode."""

    def factories(self):
        return WebSocketServerFactory(), WebSocketServerFactory()

    def test_fast_mode_serves_the_fast_protocols_behind_the_front(self):
        gateway, operator = self.factories()
        fast = paths.FastPaths()
        fast.protocols(gateway, operator)
        self.assertEqual(
            (gateway.protocol, operator.protocol), (FastGatewayProtocol, FastOperatorSocket)
        )
        listener = fast.listener(object(), gateway, Clock(), object(), operator, None)
        self.assertIsInstance(listener, FrontFactory)
        self.assertIsNot(listener.http, listener.site)  # fasthttp reads first

    def test_parts_left_out(self):
        gateway, operator = self.factories()
        fast = paths.FastPaths(["frames", "fasthttp"])
        fast.protocols(gateway, operator)
        self.assertIsNot(gateway.protocol, FastGatewayProtocol)
        site = object()
        self.assertIs(fast.listener(site, gateway, Clock(), object(), operator, None).http, site)
        self.assertIsInstance(
            paths.FastPaths(["front"]).listener(site, gateway, Clock(), object(), operator, None),
            CountedSite,
        )


class SwitchTests(SynchronousTestCase):
    def test_fast_by_default_plain_by_option_or_environment(self):
        self.assertTrue(config.fast_paths({}))
        self.assertTrue(config.fast_paths({"SANDBOX_FAST_PATHS": "1"}))
        self.assertFalse(config.fast_paths({"SANDBOX_FAST_PATHS": "0"}))
        self.assertFalse(config.fast_paths({"SANDBOX_FAST_PATHS": "1"}, {"plain": True}))

    def test_a_bad_value_is_a_clear_error(self):
        with self.assertRaises(ConfigError) as raised:
            config.fast_paths({"SANDBOX_FAST_PATHS": "yes"})
        self.assertEqual(
            str(raised.exception), "SANDBOX_FAST_PATHS must be 1 (the default) or 0, not 'yes'"
        )

    def test_nothing_is_patched_by_importing_the_gateway(self):
        import os
        import subprocess
        import sys

        code = (
            "from twisted.internet import tcp\n"
            "import trapsandbox.tap, trapsandbox.web.app, trapsandbox.fast.paths\n"
            "assert 'write' not in vars(tcp.Server), 'patched at import'\n"
        )
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        subprocess.run(
            [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": root}
        )
