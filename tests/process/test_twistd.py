"""The real daemon: ``twistd -n trapsandbox`` as a child process."""

import os
import signal
import socket
import stat

import orjson
import treq
from twisted.internet.defer import TimeoutError
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import Child, spawn_gateway
from tests.harness.support import account_table, both_modes, bounded, connect, fast_paths, reactor


class TwistdTests(TestCase):
    def twistd(self, *args: str, **env: str) -> Child:
        return spawn_gateway(self, *args, port=None, **env)

    async def ended(self, child: Child, seconds: float) -> int:
        """
        ``child``'s exit code; past ``seconds``, a failure with its log and the stack of each
        of its threads (once in a few full runs, plain mode has outlived 15 s after SIGTERM).
        """
        try:
            return await child.wait_ended(seconds)
        except TimeoutError:
            child.signal(signal.SIGABRT)
            try:
                await child.wait_ended(10)
            except TimeoutError:
                child.signal("KILL")
            self.fail(f"twistd still ran {seconds} s after SIGTERM:\n{child.output[-6000:]}")

    async def test_serves_and_stops_cleanly(self):
        child = self.twistd(
            "--port",
            "tcp:0:interface=127.0.0.1",
            SANDBOX_PASSWORD="sesame",
            OPENCODE_URL="",
            PYTHONFAULTHANDLER="1",  # SIGABRT prints every thread's stack (see ``ended``)
        )
        port = await child.listening_port()
        await child.wait_for(r"trapsandbox 0\.1\.0 started: auth on")
        await child.wait_for(
            r"mode: fast paths \(front, fasthttp, frames, patches\)"
            if fast_paths(self)
            else r"mode: plain \(Twisted, Klein and Autobahn as they ship\)"
        )

        pool = HTTPConnectionPool(reactor(), persistent=False)
        response = await bounded(treq.get(f"http://127.0.0.1:{port}/health", pool=pool))
        health = orjson.loads(await bounded(treq.content(response)))
        self.assertEqual(
            (health["sandboxOk"], health["opencodeOk"], health["opencodeDetail"]),
            (True, False, "OPENCODE_URL not set"),
        )

        computer = await connect(self, port)
        reply = await computer.hello("sesame", "12:turtle")
        self.assertTrue(reply["ok"], reply)
        await child.wait_for(r"12:turtle connected from tcp4?:127\.0\.0\.1:\d+")

        child.signal("TERM")
        self.assertEqual(await computer.wait_closed(), (1000, "server shutting down"))
        self.assertEqual(await self.ended(child, 15), 0)
        self.assertIn("Server Shut Down", child.output)
        self.assertNotIn("Traceback", child.output)
        self.assertNotIn("sesame", child.output)

    async def test_port_in_use_is_one_clear_line(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            child = self.twistd("--port", f"tcp:{port}:interface=127.0.0.1")
            self.assertEqual(await child.wait_ended(), 1)
        self.assertIn(
            f"trapsandbox: cannot listen on tcp:{port}:interface=127.0.0.1: Address already in use",
            child.output,
        )
        self.assertNotIn("Traceback", child.output)

    async def test_bad_setting_is_one_clear_line(self):
        child = self.twistd(SANDBOX_PORT="44444444")
        self.assertEqual(await child.wait_ended(), 1)
        self.assertEqual(
            child.output.strip().splitlines()[-1],
            "trapsandbox: SANDBOX_PORT must be a port number from 0 to 65535, not '44444444'",
        )
        self.assertNotIn("Traceback", child.output)

    async def test_the_state_directory_is_made_private_in_the_working_directory(self):
        cwd = os.path.abspath(self.mktemp())
        os.makedirs(cwd)
        child = spawn_gateway(self, cwd=cwd, OPENCODE_URL="")
        await child.wait_for(r"trapsandbox 0\.1\.0 started")
        for path in ("state", os.path.join("state", "ask")):
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(cwd, path)).st_mode), 0o700)

    async def test_another_users_state_directory_is_one_clear_line(self):
        if os.geteuid() != 0:
            self.skipTest("only root can give a directory to another user")
        path = os.path.abspath(self.mktemp())
        os.mkdir(path, 0o700)
        os.chown(path, 65534, 65534)
        child = self.twistd(SANDBOX_STATE_DIR=path)
        self.assertEqual(await child.wait_ended(), 1)
        self.assertEqual(
            child.output.strip().splitlines()[-1],
            f"trapsandbox: SANDBOX_STATE_DIR: {path} belongs to another user (uid 65534, the "
            "gateway runs as uid 0): give it a directory of its own",
        )


class AccountsTwistdTests(TestCase):
    twistd = TwistdTests.twistd

    async def test_sighup_reloads_a_rewritten_file(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(account_table("alice", "s-alice") + account_table("bob", "s-bob"))
        child = self.twistd(
            "--port", "tcp:0:interface=127.0.0.1", "--accounts-file", path, OPENCODE_URL=""
        )
        port = await child.listening_port()
        await child.wait_for(r"accounts: 2 from ")
        alice, bob = await connect(self, port), await connect(self, port)
        self.assertEqual((await alice.hello("s-alice", "1:"))["payload"], {"accountId": "alice"})
        self.assertEqual((await bob.hello("s-bob", "1:"))["payload"], {"accountId": "bob"})

        # A bad file keeps the accounts: one error line, nobody closed.
        with open(path, "w") as f:
            f.write("[accounts.alice\n")
        child.signal("HUP")
        await child.wait_for(r"accounts not reloaded, keeping the 2 in use: .*not TOML")
        with open(path, "w") as f:
            f.write(account_table("alice", "s-alice"))
        child.signal("HUP")
        self.assertEqual(await bob.wait_closed(), (4001, "unauthorized"))
        await child.wait_for(r"accounts reloaded from .*: 1 accounts; 1 computers closed")
        self.assertTrue((await alice.request("probe_gateway"))["ok"])
        self.assertFalse(alice.closed.called)
        self.assertNotIn("Traceback", child.output)

    async def test_a_bad_file_at_start_is_one_clear_line(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(account_table("alice", "s") + account_table("bob", "s"))
        child = self.twistd(SANDBOX_ACCOUNTS_FILE=path)
        self.assertEqual(await child.wait_ended(), 1)
        self.assertEqual(
            child.output.strip().splitlines()[-1],
            f"trapsandbox: SANDBOX_ACCOUNTS_FILE {path}: accounts alice and bob have the same "
            "secret_sha256",
        )
        missing = self.twistd("--accounts-file", path + ".missing")
        self.assertEqual(await missing.wait_ended(), 1)
        self.assertEqual(
            missing.output.strip().splitlines()[-1],
            f"trapsandbox: --accounts-file {path}.missing: cannot read it: No such file or "
            "directory",
        )
        self.assertNotIn("Traceback", child.output + missing.output)


both_modes(globals(), "TwistdTests", only=("test_serves_and_stops_cleanly",))
