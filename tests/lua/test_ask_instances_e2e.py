"""
Issue 33 on the real opencode: an asking computer's instance is given back
(opencode itself says so: ``server.instance.disposed`` for its directory on
``/global/event``), and the computer's next ask works as if nothing happened:
the same session, the computer's tools (the MCP block re-read from the
directory's ``opencode.json``).
"""

import treq
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.support import bounded, reactor
from tests.lua import test_ask_e2e as ask_e2e
from tests.lua.test_lua_e2e import GatewayMixin

FIRST = ("trapsandbox_write_file", {"computer": "7:ask", "path": "/one.txt", "content": "1"})
SECOND = ("trapsandbox_write_file", {"computer": "7:ask", "path": "/two.txt", "content": "2"})


class GlobalEvents:
    """opencode's ``/global/event`` stream, kept as bytes; ``seen(text)`` waits for ``text``."""

    def __init__(self):
        self.data = b""
        self._waiting: list[tuple[bytes, Deferred]] = []

    def received(self, chunk):
        self.data += chunk
        for entry in list(self._waiting):
            if entry[0] in self.data:
                self._waiting.remove(entry)
                entry[1].callback(None)

    def seen(self, text, seconds):
        d: Deferred = Deferred()
        if text.encode() in self.data:
            d.callback(None)
        else:
            self._waiting.append((text.encode(), d))
        return bounded(d, seconds)


class AskInstancesEndToEndTests(ask_e2e.OnSharedOpencode, GatewayMixin, TestCase):
    timeout = 150
    shared = ask_e2e.OnSharedOpencode.opencode_for_class()

    # test_ask_e2e's helpers, not its tests.
    ready = ask_e2e.AskEndToEndTests.ready
    ask = ask_e2e.AskEndToEndTests.ask
    on_screen = ask_e2e.AskEndToEndTests.on_screen

    def start_gateway(self, port, **settings):
        # Given back 1 s after the ask: the test waits for opencode to say so, no longer.
        super().start_gateway(port, ask_instance_idle=1.0, **settings)

    async def events(self):
        pool = HTTPConnectionPool(reactor(), persistent=False)
        stream = GlobalEvents()
        response = await bounded(
            treq.get(
                self.opencode_url + "/global/event",
                auth=("opencode", ask_e2e.OPENCODE_PASSWORD),
                pool=pool,
                unbuffered=True,
            )
        )
        reading = treq.collect(response, stream.received)
        reading.addErrback(lambda _: None)
        self.addCleanup(lambda: response.original._transport.stopProducing())
        return stream

    async def test_a_given_back_instance_comes_back_for_the_next_ask(self):
        model = await self.fake_model("", {}, script=[FIRST], answer="Wrote one.")
        await self.opencode(model)
        events = await self.events()
        c = await self.ready(allow="fs.write")
        self.ask(c, "/programs/sandbox.lua ask --yes write one")
        await self.on_screen(c, "Wrote one.", 90)
        (conversation,) = self.gateway.asks.conversations.values()
        # opencode's own word that the directory's instance is gone.
        where = conversation.directory
        disposed = f'"server.instance.disposed","properties":{{"directory":"{where}"'
        await events.seen(disposed, 30)
        self.assertEqual(self.gateway.asks.instances.live, {})

        model.script = [FIRST, SECOND]  # the history has one tool result: the second call next
        model.answer = "Wrote two."
        self.ask(c, "/programs/sandbox.lua ask --yes write two")
        await self.on_screen(c, "Wrote two.", 90)
        self.assertEqual(c.read_file("/two.txt"), b"2")  # the tools came back with the instance
        (again,) = self.gateway.asks.conversations.values()
        self.assertEqual(again.session_id, conversation.session_id)
        self.assertEqual(self.gateway.metrics._asks.labels("ok").value, 2)
