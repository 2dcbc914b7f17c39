"""
systemd: the units as systemd-analyze sees them, sd_notify, and a real
socket-activated run under systemd-socket-activate.
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile

import orjson
import treq
from twisted.internet.defer import Deferred
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import REPO, TWISTD, clean_env, spawn, spawn_gateway
from tests.harness.support import bounded, closed_port, connect, reactor
from trapsandbox.ops import systemd
from trapsandbox.ops.systemd import Notifier, watchdog_interval

UNITS = os.path.join(REPO, "systemd")
INSTALLED_TWISTD = "/opt/trapsandbox/venv/bin/twistd"
MAX_EXPOSURE = 2.0


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is missing: 'make test' installs the Debian package systemd")
    return path


def read(name: str) -> str:
    with open(os.path.join(UNITS, name), encoding="utf-8") as f:
        return f.read()


class UnitFileTests(SynchronousTestCase):
    """
    ``systemd-analyze verify`` checks that ExecStart's binary exists, and the
    units name where the operator installs it (/opt/trapsandbox/venv): they
    are verified as copies pointing at this venv's twistd, the only change.
    """

    def installed_copy(self, drop_in: bool = False) -> str:
        directory = self.mktemp()
        os.makedirs(directory)
        self.assertIn(INSTALLED_TWISTD, read("trapsandbox.service"))
        for name in ("trapsandbox.service", "trapsandbox.socket"):
            self.write(os.path.join(directory, name), read(name))
        if drop_in:
            os.makedirs(os.path.join(directory, "trapsandbox.service.d"))
            self.write(
                os.path.join(directory, "trapsandbox.service.d", "socket-activation.conf"),
                read("socket-activation.conf"),
            )
        return directory

    def write(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(INSTALLED_TWISTD, TWISTD))

    def analyze(self, directory: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [tool("systemd-analyze"), *args],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def assertVerifies(self, drop_in: bool) -> None:
        directory = self.installed_copy(drop_in)
        result = self.analyze(
            directory, "verify", "--man=no", "./trapsandbox.service", "./trapsandbox.socket"
        )
        # Warnings (an unknown key, a bad value) exit 0 too: none may be printed.
        self.assertEqual((result.returncode, result.stdout + result.stderr), (0, ""))

    def test_units_verify(self):
        self.assertVerifies(drop_in=False)

    def test_units_verify_with_socket_activation(self):
        self.assertVerifies(drop_in=True)

    def test_security_exposure(self):
        for drop_in in (False, True):
            directory = self.installed_copy(drop_in)
            result = self.analyze(
                directory, "security", "--offline=yes", "--no-pager", "./trapsandbox.service"
            )
            match = re.search(
                r"Overall exposure level for trapsandbox\.service: ([\d.]+)", result.stdout
            )
            self.assertIsNotNone(match, result.stdout + result.stderr)
            self.assertLessEqual(float(match.group(1)), MAX_EXPOSURE, result.stdout)

    def test_service_runs_twistd_as_the_notes_say(self):
        service = read("trapsandbox.service")
        [exec_start] = re.findall(r"^ExecStart=(.+)$", service, re.M)
        self.assertEqual(
            exec_start.split(),
            [
                INSTALLED_TWISTD,
                "--nodaemon",
                "--pidfile=",
                "--logger=trapsandbox.ops.logs.journald",
                "trapsandbox",
            ],
        )
        self.assertIn("Type=notify\n", service)
        self.assertIn("WatchdogSec=", service)
        self.assertIn("LoadCredential=password:/etc/trapsandbox/password\n", service)
        self.assertIn("Environment=SANDBOX_PASSWORD_FILE=%d/password\n", service)

    def test_the_state_directory_is_systemds(self):
        # SPEC §5: the unit's StateDirectory= is SANDBOX_STATE_DIR, private to the service.
        service = read("trapsandbox.service")
        self.assertIn("StateDirectory=trapsandbox\n", service)
        self.assertIn("StateDirectoryMode=0700\n", service)
        self.assertIn("Environment=SANDBOX_STATE_DIR=%S/trapsandbox\n", service)

    def test_socket_and_drop_in_agree_on_the_name(self):
        self.assertIn("FileDescriptorName=gateway\n", read("trapsandbox.socket"))
        drop_in = read("socket-activation.conf")
        self.assertEqual(re.findall(r"^ExecStart=(.*)$", drop_in, re.M)[0], "")
        self.assertTrue(
            re.findall(r"^ExecStart=(.+)$", drop_in, re.M)[-1].endswith(
                "trapsandbox --port systemd:domain=INET6:name=gateway"
            )
        )

    def test_environment_example_names_real_settings(self):
        from trapsandbox import config

        example = read("trapsandbox.env.example")
        names = set(re.findall(r"^#?([A-Z_]+)=", example, re.M))
        self.assertEqual(
            names,
            {
                "SANDBOX_HOST",
                "SANDBOX_PORT",
                "SANDBOX_ADMIN_TOKEN",
                "SANDBOX_ACCOUNTS_FILE",
                "SANDBOX_REQUEST_TIMEOUT_MS",
                "SANDBOX_OPENCODE_SERVERS",
                "SANDBOX_OPENCODE_MAX_RSS_MB",
                "OPENCODE_URL",
                "OPENCODE_SERVER_USERNAME",
                "OPENCODE_SERVER_PASSWORD",
                "SANDBOX_LOG_LEVEL",
            },
        )
        # Each one is read by the daemon.
        logs = os.path.join(REPO, "trapsandbox", "ops", "logs.py")
        sources = open(config.__file__).read() + open(logs).read()
        for name in names:
            self.assertIn(f'"{name}"', sources)


class _Datagrams(DatagramProtocol):
    """Every datagram received, and Deferreds fired by the ones awaited."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._waiting: list[tuple[str, int, Deferred]] = []

    def datagramReceived(self, data, addr):
        self.received.append(data.decode("utf-8"))
        for waiter in list(self._waiting):
            line, count, d = waiter
            if self.count(line) >= count:
                self._waiting.remove(waiter)
                d.callback(None)

    def count(self, line: str) -> int:
        return sum(line in message.split("\n") for message in self.received)

    def wait_for(self, line: str, count: int = 1) -> Deferred:
        d = Deferred()
        if self.count(line) >= count:
            d.callback(None)
        else:
            self._waiting.append((line, count, d))
        return bounded(d)


class NotifierTests(SynchronousTestCase):
    def receiver(self, address):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(s.close)
        s.bind(address)
        s.settimeout(5)
        return s

    def test_path_socket(self):
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        path = os.path.join(directory, "notify")
        receiver = self.receiver(path)
        notifier = Notifier(Clock(), path)
        self.addCleanup(notifier.close)
        notifier.ready("listening on 127.0.0.1:4444")
        self.assertEqual(receiver.recv(4096), b"READY=1\nSTATUS=listening on 127.0.0.1:4444")
        notifier.stopping()
        self.assertEqual(receiver.recv(4096), b"STOPPING=1\nSTATUS=shutting down")

    def test_abstract_socket(self):
        name = f"trapsandbox-test-{os.getpid()}-{id(self)}"
        receiver = self.receiver("\0" + name)
        notifier = Notifier(Clock(), "@" + name)
        self.addCleanup(notifier.close)
        notifier.notify("READY=1")
        self.assertEqual(receiver.recv(4096), b"READY=1")

    def test_watchdog_every_half_interval(self):
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        path = os.path.join(directory, "notify")
        receiver = self.receiver(path)
        receiver.setblocking(False)
        clock = Clock()
        environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"}
        notifier = Notifier.from_environ(clock, environ)
        notifier.ready()

        def drain():
            messages = []
            while True:
                try:
                    messages.append(receiver.recv(4096))
                except BlockingIOError:
                    return messages

        self.assertEqual(drain(), [b"READY=1", b"WATCHDOG=1"])
        clock.advance(4.9)
        self.assertEqual(drain(), [])
        clock.advance(0.1)
        self.assertEqual(drain(), [b"WATCHDOG=1"])
        notifier.stopping()
        self.assertEqual(drain(), [b"STOPPING=1\nSTATUS=shutting down"])
        self.assertEqual(clock.getDelayedCalls(), [])
        notifier.close()

    def test_no_socket_is_a_no_op(self):
        clock = Clock()
        notifier = Notifier.from_environ(clock, {"WATCHDOG_USEC": "1000000"})
        self.assertFalse(notifier.enabled)
        notifier.ready()
        notifier.stopping()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_unreachable_socket_is_logged_once(self):
        events = []
        self.patch(systemd, "log", Logger(observer=events.append))
        notifier = Notifier(Clock(), "/nonexistent/notify")
        notifier.notify("READY=1")
        notifier.notify("STOPPING=1")
        notifier.close()
        [event] = events
        self.assertEqual(event["log_level"], LogLevel.warn)
        self.assertIn("No such file", formatEvent(event))

    def test_watchdog_interval(self):
        self.assertEqual(watchdog_interval({"WATCHDOG_USEC": "30000000"}), 15.0)
        self.assertIsNone(watchdog_interval({}))
        self.assertIsNone(watchdog_interval({"WATCHDOG_USEC": "0"}))
        self.assertIsNone(watchdog_interval({"WATCHDOG_USEC": "x"}))
        self.assertIsNone(watchdog_interval({"WATCHDOG_USEC": "10", "WATCHDOG_PID": "1"}, pid=2))
        self.assertEqual(
            watchdog_interval({"WATCHDOG_USEC": "10", "WATCHDOG_PID": "2"}, pid=2), 5e-6
        )


class DaemonNotifyTests(TestCase):
    """The real daemon tells a NOTIFY_SOCKET it is ready, alive, then stopping."""

    async def test_ready_watchdog_stopping(self):
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        path = os.path.join(directory, "notify")
        datagrams = _Datagrams()
        port = reactor().listenUNIXDatagram(path, datagrams)
        self.addCleanup(port.stopListening)

        child = spawn_gateway(self, NOTIFY_SOCKET=path, WATCHDOG_USEC="100000", OPENCODE_URL="")
        await datagrams.wait_for("READY=1")
        # Ports are bound before READY=1.
        self.assertIn("listening on 127.0.0.1:", child.output)
        ready = next(m for m in datagrams.received if "READY=1" in m)
        self.assertRegex(ready, r"STATUS=listening on 127\.0\.0\.1:\d+")
        await datagrams.wait_for("WATCHDOG=1", 3)
        child.signal("TERM")
        await datagrams.wait_for("STOPPING=1")
        self.assertEqual(await child.wait_ended(), 0, child.output)
        self.assertEqual(datagrams.received[0].split("\n")[0], "READY=1")


class SocketActivationTests(TestCase):
    """``systemd-socket-activate`` passes a named socket, as trapsandbox.socket does."""

    async def test_socket_activated_gateway(self):
        port = closed_port()
        argv = [
            tool("systemd-socket-activate"),
            "-l",
            f"127.0.0.1:{port}",
            "--fdname=gateway",
            # It passes no environment but what -E names.
            "-E",
            "OPENCODE_URL=",
            "-E",
            "SANDBOX_PASSWORD=sesame",
            "-E",
            "SANDBOX_ADMIN_TOKEN=adm1n-secret",
            TWISTD,
            "--nodaemon",
            "--pidfile=",
            "--logger=trapsandbox.ops.logs.journald",
            "trapsandbox",
            "--port",
            "systemd:domain=INET:name=gateway",
        ]
        child = spawn(self, argv, clean_env())
        await child.wait_for(rf"Listening on 127\.0\.0\.1:{port}")

        # The first connection starts twistd, which then answers it.
        pool = HTTPConnectionPool(reactor(), persistent=False)
        response = await bounded(treq.get(f"http://127.0.0.1:{port}/health", pool=pool), 20)
        health = orjson.loads(await bounded(treq.content(response)))
        self.assertEqual((health["sandboxOk"], health["opencodeOk"]), (True, False))

        computer = await connect(self, port)
        reply = await computer.hello("sesame", "5:activated")
        self.assertTrue(reply["ok"], reply)
        await child.wait_for(r"<6>\[trapsandbox\.computers\.protocol\] 5:activated connected from")
        self.assertIn(f"<6>[trapsandbox.service] listening on 127.0.0.1:{port}\n", child.output)

        url = f"http://127.0.0.1:{port}/computers"
        response = await bounded(treq.get(url, pool=pool))
        await bounded(treq.content(response))
        self.assertEqual(response.code, 401)
        headers = {"authorization": "Bearer adm1n-secret"}
        response = await bounded(treq.get(url, headers=headers, pool=pool))
        listed = orjson.loads(await bounded(treq.content(response)))["computers"]
        self.assertEqual([c["traposId"] for c in listed], ["5:activated"])

        child.signal("TERM")
        self.assertEqual(await computer.wait_closed(), (1000, "server shutting down"))
        self.assertEqual(await child.wait_ended(), 0, child.output)
        self.assertNotIn("sesame", child.output)
        self.assertNotIn("adm1n-secret", child.output)
