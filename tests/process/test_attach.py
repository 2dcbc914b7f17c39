"""
``trapsandbox-ctl attach`` (SPEC §14) in a pseudo-terminal: the real console
script, its stdin, stdout and stderr the slave side of a pty this test holds,
against a real gateway (on loopback) and a computer on the Lua harness
running the real client.  What the script draws is read from the master side
as it comes; what the operator types is written to it.
"""

import os
import sys
import termios

import orjson
import treq
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReadDescriptor
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from tests.harness.craftos import Computer
from tests.harness.processes import Child, clean_env
from tests.harness.support import bounded, reactor, start_gateway

CTL = os.path.join(os.path.dirname(sys.executable), "trapsandbox-ctl")
ASKER = (
    "term.setTextColour(colours.lime)\nprint('MARKER-42 name?')\n"
    "term.setTextColour(colours.white)\nlocal name = read()\nprint('hello ' .. name)\n"
)


@implementer(IReadDescriptor)
class _Master:
    """The pty's master side on the reactor: what the child writes goes to ``received``."""

    def __init__(self, fd: int, received) -> None:
        self.fd = fd
        self.received = received

    def fileno(self) -> int:
        return self.fd

    def doRead(self):
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: no process holds the slave side any more
            data = b""
        if not data:
            reactor().removeReader(self)
            return None
        self.received(data)
        return None

    def connectionLost(self, reason) -> None:
        pass

    def logPrefix(self) -> str:
        return "pty"


class AttachInAPtyTests(TestCase):
    timeout = 60

    async def computer(self, port: int) -> Computer:
        c = Computer(self.mktemp(), id=7, label="si")
        self.addCleanup(c.shutdown)
        c.write_file("/asker.lua", ASKER)
        c.start_client(
            {
                "sandbox.url": f"ws://127.0.0.1:{port}/gateway",
                "sandbox.password": "sesame",
                "sandbox.allow": "exec,screen,input",
            }
        )
        await c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        return c

    def attach(self, url: str) -> tuple[Child, int, int]:
        """``trapsandbox-ctl attach 7:si`` on a new pty: the child, the master and slave fds."""
        master, slave = os.openpty()
        self.addCleanup(os.close, master)
        self.addCleanup(os.close, slave)
        child = Child()
        reader = _Master(master, child.outReceived)
        reactor().addReader(reader)
        self.addCleanup(reactor().removeReader, reader)
        env = {k: v for k, v in clean_env(TERM="xterm").items() if k != "TRAPSANDBOX_URL"}
        argv = [CTL, "--url", url, "attach", "7:si"]
        reactor().spawnProcess(child, CTL, argv, env=env, childFDs={0: slave, 1: slave, 2: slave})

        async def stop():
            if not child.ended:
                child.signal("KILL")
                await child.wait_ended(5)

        self.addCleanup(lambda: Deferred.fromCoroutine(stop()))
        return child, master, slave

    async def test_the_screen_shows_keys_reach_read_and_ctrl_bracket_leaves(self):
        gateway = start_gateway(self, password="sesame")
        url = f"http://127.0.0.1:{gateway.port}"
        c = await self.computer(gateway.port)
        child, master, slave = self.attach(url)
        before = termios.tcgetattr(slave)
        # The live screen: what the daemon printed, then a program's marker, in the pty.
        await child.wait_for(r"allowed: exec, screen, input")
        pool = HTTPConnectionPool(reactor(), persistent=False)
        run = treq.post(
            f"{url}/computers/7%3Asi/execute",
            json={"command": "asker", "timeoutMs": 30000},
            pool=pool,
        )
        await child.wait_for(r"MARKER-42 name\?")
        self.assertNotEqual(termios.tcgetattr(slave), before, "attach put the terminal in raw mode")
        # Typed keys reach the program's read(), which echoes them, then answers.
        os.write(master, b"Ada")
        await child.wait_for(r"Ada")
        os.write(master, b"\r")
        await child.wait_for(r"hello Ada")
        lines = (await bounded(treq.content(await bounded(run)))).splitlines()
        result = orjson.loads(lines[-1])
        self.assertEqual((result["type"], result["exitCode"]), ("result", 0), lines)
        self.assertIn(b"hello Ada", b"".join(lines))
        # Ctrl-] leaves: exit 0, the terminal as it was.
        os.write(master, b"\x1d")
        self.assertEqual(await child.wait_ended(10), 0, child.output)
        self.assertEqual(termios.tcgetattr(slave), before)
        # Its stream closed, the gateway cancelled the watch on the computer.
        await c.wait_for_lua("traposSandboxSession.status().watches == 0")
