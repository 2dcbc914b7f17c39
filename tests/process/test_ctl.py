"""``trapsandbox-ctl``, the console script, against a real gateway on loopback."""

import argparse
import os
import subprocess
import sys

import orjson
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.harness.processes import clean_env, spawn
from tests.harness.support import both_modes, closed_port, connect, reactor, start_gateway
from trapsandbox import limits
from trapsandbox.ops import ctl, ctl_computers, ctl_http

CTL = os.path.join(os.path.dirname(sys.executable), "trapsandbox-ctl")
PASSWORD = "sesame"
TOKEN = "ctl-token-5678"


class _JSONEverywhere(Resource):
    isLeaf = True

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        return b"{}"


def fake_opencode(testcase) -> str:
    """An HTTP server answering JSON everywhere, as a healthy opencode does at /config."""
    port = reactor().listenTCP(0, Site(_JSONEverywhere()), interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    return f"http://127.0.0.1:{port.getHost().port}"


class CtlTestCase(TestCase):
    admin_token = None
    opencode = False

    def setUp(self):
        settings = {"password": PASSWORD, "admin_token": self.admin_token}
        if self.opencode:
            settings["opencode_url"] = fake_opencode(self)
        self.gateway = start_gateway(self, **settings)
        self.url = f"http://127.0.0.1:{self.gateway.port}"

    async def ctl(self, *args, url=None, **env):
        """Run the script; ``(exit code, output)``."""
        environ = {k: v for k, v in clean_env(**env).items() if k != "TRAPSANDBOX_URL"}
        environ["TRAPSANDBOX_URL"] = url or self.url
        child = spawn(self, [CTL, *args], environ)
        code = await child.wait_ended(15)
        return code, child.output

    def start(self, *args, **env):
        environ = {k: v for k, v in clean_env(**env).items() if k != "TRAPSANDBOX_URL"}
        return spawn(self, [CTL, "--url", self.url, *args], environ)

    async def ready(self, trapos_id):
        computer = await connect(self, self.gateway.port)
        self.assertTrue((await computer.hello(PASSWORD, trapos_id))["ok"])
        return computer


class HealthTests(CtlTestCase):
    opencode = True

    async def test_health(self):
        code, output = await self.ctl("health")
        self.assertEqual(code, 0, output)
        self.assertEqual(
            output.splitlines(),
            ["sandboxOk: true", "opencodeOk: true", "computers: 0", "version: 0.1.0"],
        )


class CommandTests(CtlTestCase):
    async def test_health_with_opencode_down_fails(self):
        code, output = await self.ctl("health")
        self.assertEqual(code, 1, output)
        self.assertIn("sandboxOk: true\nopencodeOk: false\nopencode: ", output)
        self.assertIn("connection refused", output)

    async def test_computers(self):
        code, output = await self.ctl("computers")
        self.assertEqual((code, output), (0, "no computers connected\n"))
        await self.ready("7:base")
        await self.ready("12:turtle")
        code, output = await self.ctl("computers")
        self.assertEqual(code, 0, output)
        header, *rows = output.splitlines()
        self.assertEqual(
            header.split(),
            ["TRAPOS", "ID", "ACCOUNT", "PEER", "CONNECTED", "SINCE", "VERSION", "IN", "FLIGHT"],
        )
        self.assertEqual(
            [row.split()[:2] for row in rows], [["12:turtle", "local"], ["7:base", "local"]]
        )
        self.assertEqual(header.index("ACCOUNT"), rows[0].index("local"))

    async def test_ping(self):
        computer = await self.ready("7:base")
        child = self.start("ping", "7:base")
        request = await computer.next_message()
        self.assertEqual((request["type"], request["traposReceiverId"]), ("ping", "7:base"))
        computer.respond(request, payload={"traposId": "7:base"})
        self.assertEqual(await child.wait_ended(), 0, child.output)
        self.assertRegex(child.output, r"^7:base answered ping in \d+ ms\n$")

    async def test_exec_streams_output_and_exits_with_the_exit_code(self):
        computer = await connect(self, self.gateway.port)
        hello = {"traposId": "7:base", "secret": PASSWORD, "capabilities": ["exec"]}
        self.assertTrue((await computer.request("hello", hello))["ok"])
        computer.trapos_id = "7:base"
        child = self.start("exec", "7:base", "--", "count", "to", "3")
        run = await computer.next_message()
        self.assertEqual(run["payload"]["args"], ["to", "3"])
        computer.respond(run, payload={"type": "stdout_delta", "data": "1\n"}, partial=True)
        await child.wait_for("1\n")
        computer.respond(run, payload={"type": "stderr_delta", "data": "no!\n"}, partial=True)
        final = {"exitCode": 3, "timedOut": False, "durationMs": 4, "stdout": "1\n2\n"}
        computer.respond(run, payload=final)
        self.assertEqual(await child.wait_ended(), 3, child.output)
        self.assertEqual(child.output.count("1\n"), 1)
        self.assertIn("no!\n", child.output)
        self.assertIn("2\n", child.output)

    async def test_exec_forbidden_says_what_to_run(self):
        await self.ready("7:base")
        code, output = await self.ctl("exec", "7:base", "--", "ls")
        self.assertEqual(code, 1)
        self.assertEqual(
            output,
            "trapsandbox-ctl: forbidden: computer 7:base has not allowed exec: on it, run "
            '"sandbox allow exec"\n',
        )

    async def test_ping_not_connected(self):
        code, output = await self.ctl("ping", "9:")
        self.assertEqual(
            (code, output), (1, "trapsandbox-ctl: not_connected: 9: is not connected\n")
        )

    async def test_ping_timeout(self):
        computer = await self.ready("7:")
        child = self.start("ping", "7:", "--timeout", "0.2")
        await computer.next_message()
        self.assertEqual(await child.wait_ended(), 1)
        self.assertEqual(
            child.output, "trapsandbox-ctl: timeout: no answer from the computer within 0.2 s\n"
        )

    async def test_request(self):
        computer = await self.ready("7:")
        child = self.start("request", "7:", "turtle_status", "--payload", '{"verbose": true}')
        request = await computer.next_message()
        self.assertEqual(
            (request["type"], request["payload"]), ("turtle_status", {"verbose": True})
        )
        computer.respond(request, payload={"fuel": 80, "name": "café"})
        self.assertEqual(await child.wait_ended(), 0, child.output)
        self.assertEqual(orjson.loads(child.output), {"fuel": 80, "name": "café"})

    async def test_request_answered_with_an_error(self):
        computer = await self.ready("7:")
        child = self.start("request", "7:", "teleport")
        request = await computer.next_message()
        computer.respond(request, ok=False, error={"code": "unknown_type", "message": "nope"})
        self.assertEqual(await child.wait_ended(), 1)
        self.assertEqual(
            child.output,
            "trapsandbox-ctl: 7: answered teleport with an error: unknown_type: nope\n",
        )

    async def test_request_too_large(self):
        await self.ready("7:")
        path = os.path.abspath(self.mktemp())
        with open(path, "wb") as f:
            f.write(orjson.dumps({"data": "x" * 200_000}))
        code, output = await self.ctl("request", "7:", "x", "--payload", "@" + path)
        self.assertEqual(code, 1)
        self.assertTrue(output.startswith("trapsandbox-ctl: too_large: "), output[:300])

    async def test_unreachable(self):
        url = f"http://127.0.0.1:{closed_port()}"
        for command in (["health"], ["computers"], ["ping", "7:"]):
            code, output = await self.ctl(*command, url=url)
            self.assertEqual(code, 1)
            self.assertEqual(
                output, f"trapsandbox-ctl: cannot reach the gateway at {url}: Connection refused\n"
            )

    async def test_usage_errors(self):
        for args in (
            ["request", "7:", "x", "--payload", "{"],
            ["request", "7:", "x", "--payload", "[]"],
            ["ping", "7:", "--timeout", "0"],
            ["ping"],
            [],
        ):
            code, output = await self.ctl(*args)
            self.assertEqual(code, 2, args)
            self.assertIn("usage: trapsandbox-ctl", output)


class TokenTests(CtlTestCase):
    admin_token = TOKEN

    async def test_missing_token(self):
        code, output = await self.ctl("computers")
        self.assertEqual(code, 1)
        self.assertEqual(
            output,
            "trapsandbox-ctl: unauthorized: a bearer token is required "
            "(give --token or set SANDBOX_ADMIN_TOKEN)\n",
        )

    async def test_wrong_token(self):
        code, output = await self.ctl("--token", "guess", "ping", "7:")
        self.assertEqual((code, output), (1, "trapsandbox-ctl: unauthorized: wrong bearer token\n"))

    async def test_token_from_option_environment_and_file(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(TOKEN + "\n")
        for args, env in (
            (["--token", TOKEN], {}),
            ([], {"SANDBOX_ADMIN_TOKEN": TOKEN}),
            (["--token-file", path], {}),
            ([], {"SANDBOX_ADMIN_TOKEN_FILE": path}),
        ):
            code, output = await self.ctl(*args, "computers", **env)
            self.assertEqual((code, output), (0, "no computers connected\n"), args)
            self.assertNotIn(TOKEN, output)

    async def test_health_needs_no_token(self):
        code, output = await self.ctl("health")
        self.assertIn("sandboxOk: true", output)


class BatchTests(CtlTestCase):
    admin_token = TOKEN

    def requests_file(self, *lines):
        path = os.path.abspath(self.mktemp())
        with open(path, "wb") as f:
            f.write(b"".join(line + b"\n" for line in lines))
        return path

    def answers(self, output):
        return [orjson.loads(line) for line in output.splitlines() if line.startswith("{")]

    async def test_answers_come_back_by_line_and_a_failure_exits_1(self):
        computer = await self.ready("7:base")
        path = self.requests_file(
            b'{"traposId": "7:base", "type": "ping"}',
            b"",
            b'{"id": "x", "traposId": "7:base", "type": "ping", "payload": {"n": 2}}',
            b'{"traposId": "9:", "type": "ping"}',
            b"not json",
        )
        child = self.start("--token", TOKEN, "batch", "--file", path)
        requests = [await computer.next_message() for _ in range(2)]
        for request in requests:
            computer.respond(request, payload={"n": request["payload"].get("n", 1)})
        self.assertEqual(await child.wait_ended(), 1, child.output)
        answers = {answer.pop("id"): answer for answer in self.answers(child.output)}
        self.assertEqual(sorted(answers, key=str), [1, 4, 5, "x"])
        self.assertEqual(answers[1], {"status": 200, "ok": True, "payload": {"n": 1}})
        self.assertEqual(answers["x"], {"status": 200, "ok": True, "payload": {"n": 2}})
        self.assertEqual(
            (answers[4]["status"], answers[4]["error"]["code"]), (404, "not_connected")
        )
        self.assertEqual(answers[5]["status"], 400)

    async def test_stdin_at_most_concurrency_in_flight_and_all_200_exits_0(self):
        computer = await self.ready("7:base")
        child = self.start("--token", TOKEN, "batch", "--concurrency", "2")
        for n in range(5):
            line = {"id": n, "traposId": "7:base", "type": "ping", "payload": {"n": n}}
            child.transport.write(orjson.dumps(line) + b"\n")
        child.transport.closeStdin()
        for _ in range(5):
            request = await computer.next_message()
            # Never more than two at once: the next one comes only after an answer.
            self.assertLessEqual(self.gateway.registry.pending, 2)
            computer.respond(request, payload=request["payload"])
        self.assertEqual(await child.wait_ended(), 0, child.output)
        answers = self.answers(child.output)
        self.assertEqual(sorted(a["id"] for a in answers), list(range(5)))
        self.assertEqual([a["payload"]["n"] for a in answers], [a["id"] for a in answers])

    async def test_a_refusal_or_no_gateway_is_one_line_and_exits_2(self):
        path = self.requests_file(b'{"traposId": "7:", "type": "ping"}')
        code, output = await self.ctl("--token", "wrong", "batch", "--file", path)
        self.assertEqual(code, 2, output)
        self.assertEqual(
            output,
            f"trapsandbox-ctl: the gateway at ws://127.0.0.1:{self.gateway.port}/operator "
            "refused the operator socket: 401 wrong bearer token\n",
        )
        code, output = await self.ctl("batch", "--file", path)
        self.assertEqual(code, 2, output)
        self.assertIn("401 a bearer token is required (give --token", output)
        url = f"http://127.0.0.1:{closed_port()}"
        code, output = await self.ctl("--token", TOKEN, "batch", "--file", path, url=url)
        self.assertEqual(code, 2, output)
        self.assertEqual(len(output.splitlines()), 1, output)
        self.assertIn(f"cannot reach the gateway at {url}", output)
        self.assertNotIn("Traceback", output)


class ClosedPipeTests(SynchronousTestCase):
    def test_a_reader_that_went_away_ends_it_quietly(self):
        """`trapsandbox-ctl … | head`: no traceback when head stops reading."""
        reader, writer = os.pipe()
        os.close(reader)
        try:
            child = subprocess.run(
                [CTL, "--url", "http://127.0.0.1:1", "opencode-config"],
                stdout=writer,
                stderr=subprocess.PIPE,
                env=clean_env(),
                timeout=30,
            )
        finally:
            os.close(writer)
        self.assertEqual((child.returncode, child.stderr), (141, b""))


class ExplainTests(SynchronousTestCase):
    def explain(self, status, answer, token=None):
        args = argparse.Namespace(url="http://gw:4444", token=token, token_file=None)
        return ctl_http.explain(status, answer, args)

    def test_forbidden(self):
        answer = {"ok": False, "error": {"code": "forbidden", "message": "loopback only"}}
        self.assertEqual(
            self.explain(403, answer),
            "forbidden: loopback only; give --token from a non-loopback host",
        )

    def test_not_trapsandbox(self):
        self.assertEqual(
            self.explain(502, None),
            "the gateway at http://gw:4444 answered HTTP 502: is it trapsandbox?",
        )


class TimeoutTests(SynchronousTestCase):
    """How long the command waits for the gateway's answer to a request."""

    def waited(self, argv):
        calls = []
        self.patch(
            ctl_computers, "call", lambda args, method, path, body, timeout: calls.append(timeout)
        )
        args = ctl.parser().parse_args(argv)
        try:
            args.run(args)
        except (AttributeError, TypeError):
            pass  # the fake call answers None; only the timeout it was given matters
        return calls[0]

    def test_without_timeout_it_outwaits_any_gateway_default(self):
        # The gateway's default may be set up to the 24 h cap: never give up before it does.
        self.assertGreater(self.waited(["request", "7:", "ping"]), limits.MAX_REQUEST_TIMEOUT)

    def test_with_timeout_it_waits_that_long_plus_a_margin(self):
        waited = self.waited(["request", "7:", "ping", "--timeout", "5"])
        self.assertEqual(waited, 5 + limits.CTL_HTTP_MARGIN)


class AccountsCommandTests(TestCase):
    """``trapsandbox-ctl accounts``: edits the file, needs no gateway."""

    async def ctl(self, *args):
        child = spawn(self, [CTL, *args], clean_env())
        code = await child.wait_ended(15)
        return code, child.output

    async def test_add_list_remove(self):
        import re
        import stat

        from trapsandbox.admission import accounts

        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write("# the server's players\n")
        os.chmod(path, 0o644)
        code, output = await self.ctl(
            "accounts", "add", "alice", "--file", path, "--gateway-url", "http://mc.example:4444"
        )
        self.assertEqual(code, 0, output)
        secret = re.search(r"computer secret: (\S+)", output).group(1)
        token = re.search(r"operator token:  (\S+)", output).group(1)
        self.assertGreaterEqual(len(secret), 32)  # 128 bits in hex
        self.assertGreaterEqual(len(token), 32)
        self.assertIn(f"wget run http://mc.example:4444/client/install.lua {secret}", output)
        self.assertIn(f"set sandbox.password {secret}", output)
        with open(path) as f:
            text = f.read()
        self.assertTrue(text.startswith("# the server's players\n"))
        self.assertNotIn(secret, text)
        self.assertNotIn(token, text)
        found = accounts.load(path).by_name["alice"]
        self.assertEqual(
            (found.secret_sha256, found.token_sha256),
            (accounts.sha256_hex(secret), accounts.sha256_hex(token)),
        )
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)

        code, output = await self.ctl(
            "accounts", "add", "bob", "--file", path, "--max-computers", "3"
        )
        self.assertEqual(code, 0, output)
        code, output = await self.ctl("accounts", "add", "bob", "--file", path)
        self.assertEqual(code, 1)
        self.assertIn("there is already an account bob", output)
        code, output = await self.ctl("accounts", "list", "--file", path)
        self.assertEqual(
            (code, output.splitlines()), (0, ["alice  max_computers=-", "bob  max_computers=3"])
        )
        code, output = await self.ctl("accounts", "remove", "alice", "--file", path)
        self.assertEqual(code, 0, output)
        self.assertEqual(sorted(accounts.load(path).by_name), ["bob"])
        with open(path) as f:
            self.assertTrue(f.read().startswith("# the server's players\n"))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        code, output = await self.ctl("accounts", "remove", "alice", "--file", path)
        self.assertEqual(code, 1)
        self.assertIn("there is no account alice", output)

    async def test_a_new_file_is_created_0600(self):
        import stat

        path = os.path.join(os.path.abspath(self.mktemp()) + "-accounts.toml")
        code, output = await self.ctl("accounts", "add", "carol", "--file", path)
        self.assertEqual(code, 0, output)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        code, output = await self.ctl("accounts", "add", "local", "--file", path)
        self.assertEqual(code, 1)
        self.assertIn("cannot be an account name", output)

    async def test_a_bad_file_is_left_alone(self):
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write("[accounts.x\n")
        code, output = await self.ctl("accounts", "add", "dave", "--file", path)
        self.assertEqual(code, 1)
        self.assertIn("not TOML", output)
        with open(path) as f:
            self.assertEqual(f.read(), "[accounts.x\n")


class AccountTokenTests(TestCase):
    """An account's token from the CLI sees its own computers; the admin picks with --account."""

    async def test_account_token_and_admin_account(self):
        from trapsandbox.admission import accounts

        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            for name in ("alice", "bob"):
                f.write(
                    f"[accounts.{name}]\n"
                    f'secret_sha256 = "{accounts.sha256_hex("s-" + name)}"\n'
                    f'token_sha256 = "{accounts.sha256_hex("t-" + name)}"\n'
                )
        gateway = start_gateway(
            self, admin_token=TOKEN, accounts_file=path, accounts=accounts.load(path)
        )
        url = f"http://127.0.0.1:{gateway.port}"
        computers = {}
        for name in ("alice", "bob"):
            computers[name] = await connect(self, gateway.port)
            self.assertTrue((await computers[name].hello("s-" + name, "1:"))["ok"])

        child = spawn(self, [CTL, "--url", url, "--token", "t-alice", "computers"], clean_env())
        self.assertEqual(await child.wait_ended(15), 0, child.output)
        self.assertIn("alice", child.output)
        self.assertNotIn("bob", child.output)

        child = spawn(self, [CTL, "--url", url, "--token", "t-alice", "ping", "2:"], clean_env())
        self.assertEqual(await child.wait_ended(15), 1)
        self.assertIn("not_connected: 2: is not connected", child.output)

        child = spawn(self, [CTL, "--url", url, "--token", TOKEN, "screen", "1:"], clean_env())
        self.assertEqual(await child.wait_ended(15), 1)
        self.assertIn("ambiguous: 1: is connected in 2 accounts: alice, bob", child.output)

        child = spawn(
            self,
            [CTL, "--url", url, "--token", TOKEN, "--account", "bob", "ping", "1:"],
            clean_env(),
        )
        request = await computers["bob"].next_message()
        self.assertEqual(request["type"], "ping")
        computers["bob"].respond(request, payload={"traposId": "1:"})
        self.assertEqual(await child.wait_ended(15), 0, child.output)


# The HTTP routes, streaming and keep-alive batches (fasthttp's or the site's), and
# refusals at the head, in plain mode too; usage and unreachable-gateway tests do not
# depend on the mode.
both_modes(
    globals(),
    "CommandTests",
    only=(
        "test_computers",
        "test_ping",
        "test_exec_streams_output_and_exits_with_the_exit_code",
        "test_request",
        "test_request_answered_with_an_error",
        "test_request_too_large",
    ),
)
both_modes(
    globals(),
    "BatchTests",
    only=(
        "test_answers_come_back_by_line_and_a_failure_exits_1",
        "test_stdin_at_most_concurrency_in_flight_and_all_200_exits_0",
    ),
)
both_modes(globals(), "TokenTests", only=("test_missing_token", "test_wrong_token"))
