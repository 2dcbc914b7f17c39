"""
Readers that stop reading (issue 43), on real sockets: an HTTP stream holds a bounded number
of bytes for its reader, whatever the computer sends meanwhile.  (On main 0dc4e52, 64 such
screen readers grew the gateway by 2.8 GiB in a minute: every paced frame was written.)
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from tests.harness.rawhttp import events, raw
from tests.harness.support import admitted, both_modes, start_gateway
from trapsandbox.computers.hooks import ScreenPacing

WATCH = b"GET /computers/7%3Abase/screen/stream?maxFps=20 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
EVENTS = (
    b"GET /computers/7%3Abase/peripherals/events?events=disk&timeoutMs=600000 HTTP/1.1\r\n"
    b"Host: 127.0.0.1\r\n\r\n"
)
# A whole 328x162 screen changed: ~170 kB a frame to its reader; 200 of them ~34 MB.
WIDTH, HEIGHT, FRAMES = 328, 162, 200
# What may reach a reader that read nothing meanwhile: the kernel's buffers on loopback (a
# few MB) and ours; far below what was offered.
MOST_RECEIVED = 12 * 1024 * 1024


async def synced(computer) -> dict:
    """The gateway's next frame to ``computer`` once it has read all it sent before: the
    answer to a request it does not know, sent now (at once, unlike a health probe)."""
    return await computer.request("no_such_request")


def screen(n: int) -> dict:
    row = {"line": chr(ord("a") + n % 26), "text": "0", "background": "f"}
    return {
        "type": "screen",
        "width": WIDTH,
        "height": HEIGHT,
        "cursorX": n,
        "rows": {str(y): row for y in range(1, HEIGHT + 1)},
    }


class StalledReaderTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password="sesame")

    def computer(self, capabilities):
        return admitted(self, self.gateway.port, "sesame", capabilities=capabilities)

    async def test_a_screen_reader_that_stops_reading_gets_the_latest_frame_when_it_reads(self):
        computer = await self.computer(("screen",))
        # The watch's pacing (20 a second) driven here, so 200 frames take no 10 s.
        [pacing] = [h for h in self.gateway.registry.hooks if isinstance(h, ScreenPacing)]
        clock = pacing.clock = Clock()
        client = await raw(self, self.gateway.port)
        client.transport.pauseProducing()  # reads nothing from here on
        client.transport.write(WATCH)
        watch = await computer.next_message()
        self.assertEqual(watch["type"], "screen_watch")
        for n in range(FRAMES):
            computer.respond(watch, payload=screen(n), partial=True)
            await synced(computer)
            clock.advance(0.05)
        client.transport.resumeProducing()
        last = b'"cursorX":%d,' % (FRAMES - 1)
        received = await client.until(last)
        self.assertLess(len(received), MOST_RECEIVED)
        frames = received.count(b"data: {")
        # Those the kernel took before the gateway heard "pause", then the merged latest.
        self.assertLess(frames, FRAMES // 2)
        rest = await client.until(b"\n\n")
        self.assertEqual(events(received + rest)[-1]["rows"]["1"]["line"][:2], "rr")  # 199
        client.transport.loseConnection()

    async def test_an_event_reader_that_stops_reading_is_ended_with_the_reason(self):
        computer = await self.computer(("peripheral",))
        client = await raw(self, self.gateway.port)
        client.transport.pauseProducing()
        client.transport.write(EVENTS)
        watch = await computer.next_message()
        self.assertEqual(watch["type"], "peripheral_events")
        event = {"type": "event", "name": "disk", "args": ["x" * 65536]}
        cancel = None
        for _ in range(400):  # ~26 MB offered
            computer.respond(watch, payload=event, partial=True)
            answer = await synced(computer)
            if answer.get("type") == "cancel":
                cancel = answer  # the gateway ended the watch on the computer
                break
        self.assertIsNotNone(cancel, "the watch was never ended")
        self.assertEqual(cancel["payload"], {"messageId": watch["messageId"]})
        computer.respond(cancel, payload={"cancelled": True})
        computer.respond(watch, ok=False, error={"code": "cancelled", "message": "cancelled"})
        client.transport.resumeProducing()
        received = await client.until(b"event: error\ndata: ")
        self.assertLess(len(received), MOST_RECEIVED)
        tail = await client.until(b"}\n\n")
        self.assertIn(b'"code":"overloaded"', tail)
        self.assertIn(b"the reader is not reading", tail)
        await synced(computer)
        self.assertEqual(self.gateway.registry.pending, 0)


both_modes(globals(), "StalledReaderTests")
