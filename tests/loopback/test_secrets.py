"""
No secret leaks: the computers' password (right or guessed), the operator token (right or
guessed), opencode's password and its Basic-auth header value never appear in a log line at
any level, in anything sent to a computer or an HTTP client, or in /health.

The suite's kinds of traffic run against an in-process gateway with every log event captured
(debug included, Autobahn's too), and against a real ``twistd`` at SANDBOX_LOG_LEVEL=debug
whose whole output is grepped.
"""

from __future__ import annotations

import base64
import os

import orjson
import treq
import txaio
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet.defer import Deferred, gatherResults
from twisted.logger import LogLevel
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.logcapture import LogCapture, event_text
from tests.harness.processes import TWISTD, Child, clean_env, spawn
from tests.harness.servers import Opencode, basic, serve
from tests.harness.support import both_modes, bounded, closed_port, connect, reactor, start_gateway

PASSWORD = "pw-Zq8xK3vR9mTa"
GUESS = "guess-Lk2Vb7QeYu"
ADMIN = "adm-7TyPq2LwNcXo"
ADMIN_GUESS = "adm-guess-Hs4JxRz"
OPENCODE_PASSWORD = "oc-4HnB6sJdWfGi"
OPENCODE_GUESS = "oc-wrong-Pe5Ua1Ct"
URL_PASSWORD = "url-Rm3Tg8KpVn"  # a password written into OPENCODE_URL itself


def _basic_value(password: str) -> str:
    return base64.b64encode(f"opencode:{password}".encode()).decode("ascii")


SECRETS = {
    "password": PASSWORD,
    "guessed password": GUESS,
    "admin token": ADMIN,
    "guessed admin token": ADMIN_GUESS,
    "opencode password": OPENCODE_PASSWORD,
    "wrong opencode password": OPENCODE_GUESS,
    "password in OPENCODE_URL": URL_PASSWORD,
    "Basic-auth header value": _basic_value(OPENCODE_PASSWORD),
    "wrong Basic-auth header value": _basic_value(OPENCODE_GUESS),
}


class Traffic:
    """Everything a computer or an HTTP client was sent, as text."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: list[str] = []
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    async def http(self, method: str, path: str, token: str | None = None, body=None):
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        headers["Content-Type"] = "application/json"
        response = await bounded(
            treq.request(
                method,
                f"http://127.0.0.1:{self.port}{path}",
                headers=headers,
                data=None if body is None else orjson.dumps(body),
                pool=self.pool,
            )
        )
        content = await bounded(treq.content(response))
        self.seen.append(f"{response.code} {list(response.headers.getAllRawHeaders())} {content!r}")
        return response.code, content

    def got(self, frame: dict) -> dict:
        self.seen.append(repr(frame))
        return frame

    async def frame(self, computer) -> dict:
        frame = await computer.next_message()
        self.seen.append(repr(frame))
        return frame

    async def closed(self, computer) -> tuple:
        code, reason = await computer.wait_closed()
        self.seen.append(f"closed {code} {reason}")
        return code, reason


async def exercise(testcase, port: int) -> Traffic:
    """The suite's kinds of traffic, right and wrong secrets both."""
    traffic = Traffic(port)
    got = traffic.got

    # A wrong password, and no password.
    for secret in (GUESS, None):
        computer = await connect(testcase, port)
        testcase.assertEqual(got(await computer.hello(secret))["error"]["code"], "unauthorized")
        testcase.assertEqual(await traffic.closed(computer), (4001, "unauthorized"))
    # The password in the wrong shape, then with a bad traposId; requests before hello.
    computer = await connect(testcase, port)
    testcase.assertEqual(got(await computer.hello([PASSWORD]))["error"]["code"], "bad_request")
    reply = got(await computer.hello(PASSWORD, "not an id"))
    testcase.assertEqual(reply["error"]["code"], "bad_request")
    reply = got(await computer.request("probe_gateway"))
    testcase.assertEqual(reply["error"]["code"], "not_authenticated")

    # The right password; every kind of request.
    computer = await connect(testcase, port)
    testcase.assertTrue(got(await computer.hello(PASSWORD, "7:base"))["ok"])
    reply = got(await computer.hello(PASSWORD, "7:base"))  # again on the same connection
    testcase.assertEqual(reply["error"]["code"], "bad_request")
    for kind in ("probe_gateway", "health", "teleport"):
        got(await computer.request(kind))
    computer.send(b"{not json " + PASSWORD.encode())
    computer.send({"event": "computer_request", "messageId": "m", "type": "x", "secret": GUESS})
    testcase.assertEqual((await traffic.frame(computer))["error"]["code"], "bad_request")

    # Operators: right, wrong, empty and no token.
    for token in (ADMIN, ADMIN_GUESS, "", None):
        await traffic.http("GET", "/computers", token)
        await traffic.http("GET", "/metrics", token)
    await traffic.http("GET", "/health")
    await traffic.http("GET", "/health", ADMIN_GUESS)
    await traffic.http("POST", "/computers/7%3Abase/requests", ADMIN_GUESS, {"type": "ping"})
    # A request to the computer through the API, answered; refused ones; an unanswered one.
    asked = Deferred.fromCoroutine(
        traffic.http("POST", "/computers/7%3Abase/requests", ADMIN, {"type": "ping"})
    )
    request = await traffic.frame(computer)
    computer.respond(request, payload={"traposId": "7:base"})
    testcase.assertEqual((await asked)[0], 200)
    await traffic.http("POST", "/computers/7%3Abase/requests", ADMIN, {"type": ""})
    await traffic.http("POST", "/computers/9%3Anone/requests", ADMIN, {"type": "ping"})
    asked = Deferred.fromCoroutine(
        traffic.http(
            "POST", "/computers/7%3Abase/requests", ADMIN, {"type": "ping", "timeoutMs": 50}
        )
    )
    await traffic.frame(computer)
    testcase.assertEqual((await asked)[0], 504)

    # A newer connection replaces it; a request is pending on that one when it drops.
    newer = await connect(testcase, port)
    testcase.assertTrue(got(await newer.hello(PASSWORD, "7:base"))["ok"])
    await traffic.closed(computer)
    asked = Deferred.fromCoroutine(
        traffic.http("POST", "/computers/7%3Abase/requests", ADMIN, {"type": "ping"})
    )
    await traffic.frame(newer)
    newer.dropConnection(abort=True)
    testcase.assertEqual((await asked)[0], 404)
    return traffic


class SecretsInProcessTests(TestCase):
    def setUp(self):
        # Autobahn logs through txaio, which drops debug events before they are published.
        level = txaio.get_global_log_level()
        txaio.set_global_log_level("debug")
        self.addCleanup(txaio.set_global_log_level, level)
        self.log = LogCapture(self)

    def assertNoSecrets(self, texts: list[str], where: str):
        for text in texts:
            for name, secret in SECRETS.items():
                if secret in text:
                    self.fail(f"the {name} is in {where}:\n{text}")

    def gateway_events(self) -> list[str]:
        # The test's own WebSocket clients log through the same publisher: not the gateway's.
        return [
            event_text(event)
            for event in self.log.events
            if not isinstance(
                event.get("log_source"), WebSocketClientProtocol | WebSocketClientFactory
            )
        ]

    async def test_no_secret_in_logs_answers_or_health(self):
        opencode = Opencode(OPENCODE_PASSWORD)
        gateway = start_gateway(
            self,
            password=PASSWORD,
            admin_token=ADMIN,
            opencode_url=serve(self, opencode),
            opencode_password=OPENCODE_PASSWORD,
        )
        traffic = await exercise(self, gateway.port)
        # The probes were made, with the right credentials, and succeeded.
        self.assertIn(basic("opencode", OPENCODE_PASSWORD), opencode.authorizations)
        code, body = await traffic.http("GET", "/health")
        self.assertEqual(orjson.loads(body)["opencodeOk"], True)
        # A connection that never says hello.
        gateway.factory.hello_timeout = 0.3
        silent = await connect(self, gateway.port)
        self.assertEqual(await traffic.closed(silent), (4002, "hello timeout"))

        # Wrong opencode credentials, no opencode at all.
        wrong = Opencode(OPENCODE_PASSWORD)
        details = []
        for url, password in (
            (serve(self, wrong), OPENCODE_GUESS),
            (f"http://127.0.0.1:{closed_port()}", OPENCODE_PASSWORD),
        ):
            other = start_gateway(
                self, password=PASSWORD, opencode_url=url, opencode_password=password
            )
            other_traffic = Traffic(other.port)
            await other_traffic.http("GET", "/health")
            computer = await connect(self, other.port)
            other_traffic.got(await computer.hello(PASSWORD))
            reply = other_traffic.got(await computer.request("probe_gateway"))
            details.append(reply["payload"]["opencodeDetail"])
            traffic.seen.extend(other_traffic.seen)
            await other.service.stopService()
        self.assertEqual(wrong.authorizations[0], basic("opencode", OPENCODE_GUESS))
        self.assertIn("401 Unauthorized", details[0])
        self.assertIn("connection refused", details[1])

        await gateway.service.stopService()  # its shutdown is logged too
        self.flushLoggedErrors()  # any error is in self.log and fails below anyway
        texts = self.gateway_events()
        self.assertNoSecrets(traffic.seen, "what clients were sent")
        self.assertNoSecrets(texts, "the log")
        # The checks saw the traffic: debug events, the refusals and the HTTP answers.
        levels = {event.get("log_level") for event in self.log.events}
        self.assertIn(LogLevel.debug, levels)
        self.assertTrue(any("refused: wrong secret" in text for text in texts))
        self.assertGreater(len(traffic.seen), 40)
        # A password in OPENCODE_URL makes every probe log a traceback: a known bug (see
        # tests/loopback/test_opencode_faults.py, CredentialsInURLTests); nothing else may.
        errors = [text for text in self.log.errors() if "invalid hostname: opencode:@" not in text]
        self.assertEqual(errors, [])


class SecretsTwistdTests(TestCase):
    timeout = 60

    def twistd(self, *args: str, **env: str) -> Child:
        argv = [TWISTD, "-n", "--pidfile=", *args]
        return spawn(self, argv, clean_env(**env))

    async def run_daemon(self, logger_args: tuple[str, ...], **env: str) -> str:
        port = "tcp:0:interface=127.0.0.1"
        child = self.twistd(*logger_args, "trapsandbox", "--port", port, **env)
        port = await child.listening_port()
        await exercise(self, port)
        child.signal("TERM")
        self.assertEqual(await child.wait_ended(10), 0, child.output)
        return child.output

    async def test_no_secret_in_the_daemon_output_at_debug_level(self):
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        password_file = os.path.join(directory, "password")
        with open(password_file, "w") as f:
            f.write(PASSWORD + "\n")
        opencode = Opencode(OPENCODE_PASSWORD)
        url = serve(self, opencode)
        common = {
            "SANDBOX_ADMIN_TOKEN": ADMIN,
            "OPENCODE_SERVER_PASSWORD": OPENCODE_PASSWORD,
            "SANDBOX_LOG_LEVEL": "debug",
        }
        outputs = await gatherResults(
            [
                # JSON lines, the password given directly.
                Deferred.fromCoroutine(
                    self.run_daemon(
                        ("--logger=trapsandbox.ops.logs.json",),
                        SANDBOX_PASSWORD=PASSWORD,
                        OPENCODE_URL=url,
                        **common,
                    )
                ),
                # twistd's own text log, the password from a file.
                Deferred.fromCoroutine(
                    self.run_daemon(
                        (), SANDBOX_PASSWORD_FILE=password_file, OPENCODE_URL=url, **common
                    )
                ),
            ]
        )
        # A password in OPENCODE_URL stops the daemon at start, without showing it.
        refused = self.twistd(
            "trapsandbox",
            "--port",
            "tcp:0:interface=127.0.0.1",
            OPENCODE_URL=url.replace("//", f"//opencode:{URL_PASSWORD}@"),
            **common,
        )
        self.assertEqual(await refused.wait_ended(10), 1)
        self.assertIn("OPENCODE_URL must not carry user:password@", refused.output)
        self.assertNotIn(URL_PASSWORD, refused.output)
        self.assertIn(basic("opencode", OPENCODE_PASSWORD), opencode.authorizations)
        json_output, text_output = outputs
        self.assertIn('"level":"debug"', json_output)  # debug was on
        for output in outputs:
            self.assertIn("refused: wrong secret", output)
            self.assertNotIn("Traceback", output)
            for name, secret in SECRETS.items():
                self.assertNotIn(secret, output, f"the {name} is in the daemon's output")


both_modes(globals(), "SecretsInProcessTests", "SecretsTwistdTests")
