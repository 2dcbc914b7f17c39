"""Accounts (SPEC §12): the file, resolution, scoping of every operator surface, reload."""

import os
import stat
import tempfile

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.callers import asking
from tests.harness.fakes import SandboxComputer
from tests.harness.support import JSON
from trapsandbox import errors, limits
from trapsandbox.admission import accounts, auth
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import ConfigError, GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT

THERE = IPv4Address("TCP", "203.0.113.9", 5000)
HERE = IPv4Address("TCP", "127.0.0.1", 5000)
NAMES = ("alice", "bob", "carol")
ADMIN_TOKEN = "admin"


def secret_of(name):
    return f"secret-of-{name}"


def token_of(name):
    return f"token-of-{name}"


def table(name, secret=None, token=None, **extra):
    lines = [
        f"[accounts.{name}]",
        f'secret_sha256 = "{accounts.sha256_hex(secret or secret_of(name))}"',
        f'token_sha256 = "{accounts.sha256_hex(token or token_of(name))}"',
    ]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def some(*names, **extra):
    return accounts.parse("".join(table(name, **extra) for name in names))


class FileTests(SynchronousTestCase):
    def write(self, text, name="accounts.toml"):
        directory = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(directory))
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def error(self, text):
        path = self.write(text)
        with self.assertRaises(ConfigError) as caught:
            accounts.load(path)
        message = str(caught.exception)
        self.assertTrue(message.startswith(f"SANDBOX_ACCOUNTS_FILE {path}: "), message)
        self.assertNotIn("\n", message)
        return message[len(f"SANDBOX_ACCOUNTS_FILE {path}: ") :]

    def test_a_good_file(self):
        found = accounts.load(self.write(table("alice") + table("bob", max_computers=2)))
        self.assertEqual(sorted(found.by_name), ["alice", "bob"])
        self.assertEqual(found.by_name["bob"].max_computers, 2)
        self.assertIsNone(found.by_name["alice"].max_computers)
        self.assertIs(found.by_secret[accounts.sha256_hex("secret-of-bob")], found.by_name["bob"])
        self.assertIs(found.by_token[accounts.sha256_hex("token-of-bob")], found.by_name["bob"])

    def test_an_empty_file_has_no_accounts(self):
        self.assertEqual(len(accounts.load(self.write(""))), 0)

    def test_missing(self):
        with self.assertRaises(ConfigError) as caught:
            accounts.load("/nonexistent/accounts.toml", "--accounts-file")
        self.assertEqual(
            str(caught.exception),
            "--accounts-file /nonexistent/accounts.toml: cannot read it: No such file or directory",
        )

    def test_not_toml(self):
        self.assertTrue(self.error("[accounts.alice\n").startswith("not TOML: "))

    def test_bad_hash(self):
        text = table("alice").replace(accounts.sha256_hex("secret-of-alice"), "ABC")
        self.assertEqual(
            self.error(text),
            "accounts.alice.secret_sha256 must be 64 lower-case hex digits (a SHA-256)",
        )
        upper = table("alice").replace(
            accounts.sha256_hex("token-of-alice"), accounts.sha256_hex("token-of-alice").upper()
        )
        self.assertIn("token_sha256 must be 64 lower-case hex", self.error(upper))

    def test_missing_hash(self):
        text = "[accounts.alice]\n" + table("alice").splitlines()[1] + "\n"
        self.assertEqual(self.error(text), "accounts.alice needs token_sha256")

    def test_unknown_key(self):
        self.assertEqual(
            self.error(table("alice", colour='"red"')),
            "accounts.alice has an unknown key 'colour' (known: max_computers, secret_sha256, "
            "token_sha256)",
        )
        self.assertIn("unknown top-level key 'users'", self.error("[users]\n"))

    def test_duplicate_secret(self):
        text = table("alice") + table("bob", secret=secret_of("alice"))
        self.assertEqual(self.error(text), "accounts alice and bob have the same secret_sha256")
        text = table("alice") + table("bob", token=token_of("alice"))
        self.assertEqual(self.error(text), "accounts alice and bob have the same token_sha256")

    def test_bad_names_and_limits(self):
        self.assertIn("the SANDBOX_PASSWORD's", self.error(table("local")))
        self.assertIn("must be 1 to 64 of", self.error(table('"a b"')))
        self.assertIn(
            "max_computers must be a whole number", self.error(table("a", max_computers=0))
        )
        self.assertIn(
            "max_computers must be a whole number", self.error(table("a", max_computers='"2"'))
        )

    def test_not_utf8(self):
        path = self.write("")
        with open(path, "wb") as f:
            f.write(b"\xff\xfe")
        with self.assertRaises(ConfigError) as caught:
            accounts.load(path)
        self.assertIn("not UTF-8", str(caught.exception))


class ResolutionTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.admission = auth.Admission(
            self.clock, admin_token="admin", accounts=some("alice", "bob", max_computers=3)
        )

    def test_a_file_turns_auth_on_without_a_password(self):
        self.assertTrue(self.admission.enabled)
        self.assertEqual(self.admission.computer("h", "secret-of-alice", "1:").account, "alice")
        self.assertEqual(self.admission.computer("h", "secret-of-bob", "1:").account, "bob")
        for wrong in ("sesame", None, "", 7):
            self.assertEqual(self.admission.computer("h2", wrong, "1:").reason, auth.WRONG)
        self.assertEqual(self.admission.account_names(), ["alice", "bob"])
        self.assertEqual(self.admission.max_computers("bob"), 3)
        self.assertIsNone(self.admission.max_computers(limits.LOCAL_ACCOUNT))

    def test_the_secret_is_hashed_once_and_the_digest_kept(self):
        # The session keeps this digest; a reload compares it (``admits``).
        admitted = self.admission.computer("h", "secret-of-alice", "1:")
        self.assertEqual(admitted, auth.Admitted("alice", accounts.sha256_hex("secret-of-alice")))
        self.assertTrue(self.admission.admits("alice", admitted.credential))

    def test_max_computers_is_decided_by_admission(self):
        registry = Registry(self.clock)
        for n in range(3):
            self.assertIsNone(self.admission.room("bob", f"{n}:", registry))
            SandboxComputer.connect(registry, f"{n}:", account_id="bob")
        refusal = self.admission.room("bob", "9:", registry)
        self.assertEqual(refusal.reason, auth.FULL)
        self.assertIn("already has 3 computers connected", refusal.message)
        # A computer replacing its own connection takes no more room; another account has its own.
        self.assertIsNone(self.admission.room("bob", "1:", registry))
        self.assertIsNone(self.admission.room("alice", "9:", registry))

    def test_the_password_is_local_beside_the_file(self):
        admission = auth.Admission(self.clock, password="sesame", accounts=some("alice"))
        self.assertEqual(admission.computer("h", "sesame", "1:").account, limits.LOCAL_ACCOUNT)
        self.assertEqual(admission.computer("h", "secret-of-alice", "1:").account, "alice")
        self.assertEqual(admission.account_names(), [limits.LOCAL_ACCOUNT, "alice"])

    def test_the_password_or_admin_token_cannot_be_an_accounts(self):
        with self.assertRaises(ConfigError):
            auth.Admission(self.clock, password="secret-of-alice", accounts=some("alice"))
        with self.assertRaises(ConfigError):
            auth.Admission(self.clock, admin_token="token-of-bob", accounts=some("bob"))

    def test_operator_tokens(self):
        self.assertEqual(self.admission.operator(THERE, b"Bearer admin"), auth.ADMIN)
        self.assertEqual(
            self.admission.operator(THERE, b"Bearer token-of-alice"), auth.Operator("alice")
        )
        self.assertEqual(
            self.admission.operator(THERE, b"bearer token-of-bob "), auth.Operator("bob")
        )
        self.assertEqual(self.admission.operator(THERE, b"Bearer secret-of-bob").reason, auth.WRONG)
        self.assertEqual(self.admission.operator(HERE, None).reason, auth.MISSING)

    def test_without_an_admin_token_loopback_is_the_admin_and_tokens_work_anywhere(self):
        admission = auth.Admission(self.clock, accounts=some("alice"))
        self.assertEqual(admission.operator(HERE, None), auth.ADMIN)
        self.assertEqual(admission.operator(THERE, None).reason, auth.MISSING)
        self.assertEqual(
            admission.operator(THERE, b"Bearer token-of-alice"), auth.Operator("alice")
        )
        self.assertEqual(admission.operator(HERE, b"Bearer nope").reason, auth.WRONG)

    def test_throttles_stay_per_address_and_let_accounts_in(self):
        for _ in range(limits.FREE_FAILURES + 1):
            self.admission.operator(THERE, b"Bearer guess")
            self.admission.computer("h", "guess", "1:")
        self.assertEqual(self.admission.operator(THERE, b"Bearer guess").reason, auth.THROTTLED)
        self.assertEqual(self.admission.computer("h", "guess", "1:").reason, auth.THROTTLED)
        # An account's right token and secret still work from the blocked address.
        self.assertEqual(
            self.admission.operator(THERE, b"Bearer token-of-alice"), auth.Operator("alice")
        )
        self.assertEqual(self.admission.computer("h", "secret-of-alice", "1:").account, "alice")
        other = IPv4Address("TCP", "198.51.100.1", 1)
        self.assertEqual(self.admission.operator(other, b"Bearer guess").reason, auth.WRONG)
        self.assertEqual(self.admission.computer("h2", "guess", "1:").reason, auth.WRONG)

    def test_a_token_is_looked_up_by_its_hash(self):
        # A guess is hashed once and looked up: no stored hash is compared with it.
        looked_up = []

        class Spy(dict):
            def get(self, key, default=None):
                looked_up.append(key)
                return super().get(key, default)

        found = self.admission.accounts
        self.admission.accounts = accounts.Accounts(
            found.by_name, Spy(found.by_secret), Spy(found.by_token)
        )
        self.admission.operator(THERE, b"Bearer guess")
        self.admission.computer("h", "guess", "1:")
        self.assertEqual(looked_up, [accounts.sha256_hex("guess")] * 2)


class ScopeTests(SynchronousTestCase):
    def setUp(self):
        self.registry = Registry(Clock())
        for account in ("alice", "bob"):
            SandboxComputer.connect(self.registry, "1:", account_id=account)
        SandboxComputer.connect(self.registry, "2:", account_id="bob")

    def account_of(self, operator, trapos_id, asked=None):
        try:
            return operator.account_of(self.registry, trapos_id, asked)
        except GatewayError as error:
            return error.code, error.message

    def test_an_account_reaches_its_own_only(self):
        # The account meant; whether it holds the computer is the request's to find out
        # (here, on another gateway process, or nowhere: the same answer for the last two).
        alice = auth.Operator("alice")
        self.assertEqual(self.account_of(alice, "1:"), "alice")
        self.assertEqual(self.account_of(alice, "1:", "alice"), "alice")
        self.assertEqual(self.account_of(alice, "2:"), "alice")
        self.assertEqual(self.account_of(alice, "2:", "bob"), auth.NOBODY)
        self.assertEqual(self.account_of(alice, "1:", "bob"), auth.NOBODY)
        d = self.registry.request(asking("2:", self.account_of(alice, "2:")), "ping")
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.NOT_CONNECTED)

    def test_the_admin(self):
        self.assertEqual(self.account_of(auth.ADMIN, "2:"), "bob")
        self.assertEqual(self.account_of(auth.ADMIN, "1:", "alice"), "alice")
        self.assertEqual(
            self.account_of(auth.ADMIN, "1:"),
            (
                errors.AMBIGUOUS,
                "1: is connected in 2 accounts: alice, bob; say which with ?account=NAME",
            ),
        )
        self.assertEqual(self.account_of(auth.ADMIN, "2:", "alice"), "alice")
        # Held by no account here: local's, maybe on another gateway process.
        self.assertEqual(self.account_of(auth.ADMIN, "3:"), LOCAL_ACCOUNT)

    def test_the_registry_keeps_its_indexes(self):
        self.assertEqual(self.registry.accounts_holding("1:"), ["alice", "bob"])
        self.assertEqual(self.registry.counts(), {"alice": 1, "bob": 2})
        for session in self.registry.of_account("bob"):
            self.registry.remove(session)
        self.assertEqual(self.registry.accounts_holding("1:"), ["alice"])
        self.assertEqual(self.registry.accounts_holding("2:"), [])
        self.assertEqual(self.registry.counts(), {"alice": 1})


class ReloadTests(SynchronousTestCase):
    def test_removed_accounts_and_changed_secrets_are_revoked(self):
        clock = Clock()
        admission = auth.Admission(clock, password="sesame", accounts=some("alice", "bob", "carol"))
        registry = Registry(clock)
        computers = {}
        for account, secret in (
            ("alice", "secret-of-alice"),
            ("bob", "secret-of-bob"),
            ("carol", "secret-of-carol"),
            (limits.LOCAL_ACCOUNT, "sesame"),
        ):
            computer = SandboxComputer.connect(registry, "1:", account_id=account)
            computer.session.credential = accounts.sha256_hex(secret)
            computers[account] = computer
        self.assertEqual(admission.revoked(registry), [])
        # bob is gone, carol has a new secret, alice is unchanged.
        admission.reload(
            accounts.parse(table("alice") + table("carol", secret="new") + table("dave"))
        )
        revoked = admission.revoked(registry)
        self.assertEqual(sorted(s.account_id for s in revoked), ["bob", "carol"])
        self.assertEqual(admission.computer("h", "secret-of-bob", "1:").reason, auth.WRONG)
        self.assertEqual(admission.computer("h", "new", "1:").account, "carol")
        self.assertEqual(admission.computer("h", "secret-of-dave", "1:").account, "dave")

    def test_a_clashing_reload_changes_nothing(self):
        admission = auth.Admission(Clock(), password="sesame", accounts=some("alice"))
        before = admission.accounts
        with self.assertRaises(ConfigError):
            admission.reload(accounts.parse(table("bob", secret="sesame")))
        self.assertIs(admission.accounts, before)


class EditTests(SynchronousTestCase):
    def setUp(self):
        self.directory = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(self.directory))
        self.path = os.path.join(self.directory, "accounts.toml")

    def test_add_and_remove_keep_the_rest(self):
        text = "# players of the server\n" + table("alice") + "\n# bob next\n" + table("bob")
        alice = accounts.parse(text).by_name["alice"]
        carol = accounts.Account("carol", "c" * 64, "d" * 64, 4)
        added = accounts.with_account(text, carol)
        self.assertTrue(added.startswith(text))
        self.assertEqual(accounts.parse(added).by_name["carol"], carol)
        removed = accounts.without_account(added, "bob")
        self.assertIn("# players of the server", removed)
        self.assertIn("# bob next", removed)
        self.assertEqual(sorted(accounts.parse(removed).by_name), ["alice", "carol"])
        self.assertEqual(accounts.parse(removed).by_name["alice"], alice)
        with self.assertRaises(ValueError):
            accounts.with_account(added, carol)
        with self.assertRaises(ValueError):
            accounts.without_account(removed, "bob")
        with self.assertRaises(ValueError):
            accounts.with_account(text, accounts.Account("dave", alice.secret_sha256, "e" * 64))

    def test_write_is_0600(self):
        accounts.write_text(self.path, "# new\n")
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o600)
        os.chmod(self.path, 0o644)
        accounts.write_text(self.path, "# again\n")
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o600)
        self.assertEqual(accounts.read_text(self.path), "# again\n")
        self.assertEqual(os.listdir(self.directory), ["accounts.toml"])


class ScopedHTTPTests(SynchronousTestCase):
    """No sequence of tokens, traposIds and ?account= reaches another account's computer."""

    def app(self, computers):
        clock = Clock()
        registry = Registry(clock)
        admission = auth.Admission(clock, admin_token="admin", accounts=some(*NAMES))
        app = gateway_app(registry, admission=admission)
        connected = {}
        for account, trapos_id in computers:
            connected[(account, trapos_id)] = SandboxComputer.connect(
                registry, trapos_id, account_id=account
            )
        return StubTreq(app.resource()), connected

    def call(self, http, method, path, token, body=None):
        response = self.successResultOf(
            http.request(
                method,
                "http://gw:4444" + path,
                headers={"authorization": f"Bearer {token}", **JSON},
                data=None if body is None else orjson.dumps(body),
            )
        )
        return response.code, orjson.loads(self.successResultOf(http.content(response)))

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(
        computers=st.sets(st.tuples(st.sampled_from(NAMES), st.sampled_from(("1:", "2:", "1:x")))),
        queries=st.lists(
            st.tuples(
                st.sampled_from(NAMES),
                st.sampled_from(("1:", "2:", "1:x", "3:")),
                st.sampled_from((None, *NAMES)),
                st.sampled_from(("screen", "requests", "list-files", "mcp")),
            ),
            max_size=8,
        ),
    )
    def test_no_token_reaches_another_accounts_computer(self, computers, queries):
        http, connected = self.app(computers)
        for name, trapos_id, asked, surface in queries:
            quoted = trapos_id.replace(":", "%3A")
            query = "" if asked is None else f"?account={asked}"
            before = {key: len(c.sent) for key, c in connected.items()}
            if surface == "screen":
                status, body = self.call(
                    http, "GET", f"/computers/{quoted}/screen{query}", token_of(name)
                )
            elif surface == "requests":
                status, body = self.call(
                    http,
                    "POST",
                    f"/computers/{quoted}/requests{query}",
                    token_of(name),
                    {"type": "screen"},
                )
            elif surface == "list-files":
                status, body = self.call(
                    http,
                    "POST",
                    f"/computers/{quoted}/list-files{query}",
                    token_of(name),
                    {"path": "/"},
                )
            else:
                status, body = self.call(
                    http,
                    "POST",
                    f"/mcp{query}",
                    token_of(name),
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": "read_screen", "arguments": {"computer": trapos_id}},
                    },
                )
            reached = [key for key, c in connected.items() if len(c.sent) > before[key]]
            own = (name, trapos_id) in computers and asked in (None, name)
            # Only the caller's own computer, and only the one it named, ever hears of it.
            self.assertEqual(reached, [(name, trapos_id)] if own else [])
            if not own and surface != "mcp":
                self.assertEqual(status, 404)
                missing = {
                    "screen": {
                        "ok": False,
                        "error": f"{trapos_id} is not connected",
                        "code": "not_connected",
                    },
                    "list-files": {
                        "ok": False,
                        "error": f"{trapos_id} is not connected",
                        "code": "not_connected",
                    },
                    "requests": {
                        "ok": False,
                        "error": {
                            "code": "not_connected",
                            "message": f"{trapos_id} is not connected",
                        },
                    },
                }[surface]
                self.assertEqual(body, missing)
            if surface == "mcp":
                self.assertEqual(body["result"].get("isError", False), not own)
            # Every listing shows the caller's own computers only.
        for name in NAMES:
            status, body = self.call(http, "GET", "/computers", token_of(name))
            self.assertEqual(
                sorted((c["accountId"], c["traposId"]) for c in body["computers"]),
                sorted(key for key in computers if key[0] == name),
            )


class AdminHTTPTests(SynchronousTestCase):
    def setUp(self):
        clock = Clock()
        self.registry = Registry(clock)
        admission = auth.Admission(clock, admin_token="admin", accounts=some("alice", "bob"))
        self.metrics_app = gateway_app(self.registry, admission=admission)
        self.metrics_app._metrics.watch_accounts(
            lambda: {**dict.fromkeys(admission.account_names(), 0), **self.registry.counts()}
        )
        self.http = StubTreq(self.metrics_app.resource())
        self.alice = SandboxComputer.connect(self.registry, "1:", account_id="alice")
        self.bob = SandboxComputer.connect(self.registry, "1:", account_id="bob")

    def get(self, path, token="admin"):
        response = self.successResultOf(
            self.http.get("http://gw:4444" + path, headers={"authorization": f"Bearer {token}"})
        )
        return response.code, self.successResultOf(self.http.content(response))

    def test_an_ambiguous_traposid_is_409_listing_the_accounts(self):
        status, body = self.get("/computers/1%3A/screen")
        self.assertEqual(status, 409)
        self.assertEqual(
            orjson.loads(body),
            {
                "ok": False,
                "code": "ambiguous",
                "error": "1: is connected in 2 accounts: alice, bob; say which with ?account=NAME",
            },
        )
        self.assertEqual(self.get("/computers/1%3A/screen?account=bob")[0], 200)
        self.assertEqual((len(self.alice.sent), len(self.bob.sent)), (0, 1))

    def test_the_admin_lists_every_account_or_one(self):
        listed = orjson.loads(self.get("/computers")[1])["computers"]
        self.assertEqual([c["accountId"] for c in listed], ["alice", "bob"])
        listed = orjson.loads(self.get("/computers?account=bob")[1])["computers"]
        self.assertEqual([c["accountId"] for c in listed], ["bob"])

    def test_metrics_are_the_admins(self):
        status, body = self.get("/metrics", token="token-of-alice")
        self.assertEqual(status, 403)
        self.assertEqual(orjson.loads(body)["error"]["code"], "forbidden")
        status, body = self.get("/metrics")
        self.assertEqual(status, 200)
        self.assertIn(b'trapsandbox_account_computers_connected{account="alice"} 1.0', body)
        self.assertIn(b'trapsandbox_account_computers_connected{account="bob"} 1.0', body)

    def mcp(self, token, name, arguments=None, query=""):
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments or {}},
        }
        response = self.successResultOf(
            self.http.post(
                "http://gw:4444/mcp" + query,
                headers={"authorization": f"Bearer {token}", **JSON},
                data=orjson.dumps(body),
            )
        )
        return orjson.loads(self.successResultOf(self.http.content(response)))["result"]

    def test_mcp_lists_and_resolves_in_the_tokens_account(self):
        listed = self.mcp("token-of-alice", "list_computers")["structuredContent"]["computers"]
        self.assertEqual([(c["accountId"], c["traposId"]) for c in listed], [("alice", "1:")])
        # Omitted computer: alice has exactly one, so it is that one.
        self.assertFalse(self.mcp("token-of-alice", "read_screen").get("isError", False))
        self.assertEqual((len(self.alice.sent), len(self.bob.sent)), (1, 0))
        listed = self.mcp(ADMIN_TOKEN, "list_computers")
        self.assertIn("account bob", listed["content"][0]["text"])
        ambiguous = self.mcp(ADMIN_TOKEN, "read_screen", {"computer": "1:"})
        self.assertTrue(ambiguous["isError"])
        self.assertIn("?account=NAME", ambiguous["content"][0]["text"])
        scoped = self.mcp(ADMIN_TOKEN, "read_screen", {"computer": "1:"}, "?account=bob")
        self.assertFalse(scoped.get("isError", False))
        self.assertEqual((len(self.alice.sent), len(self.bob.sent)), (1, 1))
