"""Settings from the environment and twistd options, and their errors."""

import ipaddress
import sys
from unittest import mock

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import config
from trapsandbox.errors import ConfigError
from trapsandbox.tap import Options


def options(*argv):
    parsed = Options()
    parsed.parseOptions(list(argv))
    return parsed


class ConfigTests(SynchronousTestCase):
    def load(self, environ=None, *argv):
        return config.load(environ or {}, options(*argv))

    def assertConfigError(self, environ, *argv, names):
        with self.assertRaises(ConfigError) as caught:
            self.load(environ, *argv)
        self.assertIn(names, str(caught.exception))
        return str(caught.exception)

    def test_defaults(self):
        settings = self.load()
        self.assertEqual(settings.ports, ("tcp:4444:interface=0.0.0.0",))
        self.assertIsNone(settings.password)
        self.assertEqual(settings.request_timeout, 600)
        # Unset: the gateway runs opencode itself (issue 45); empty: no agent.
        self.assertIsNone(settings.opencode_url)
        self.assertTrue(settings.managed)
        self.assertEqual(settings.opencode_servers, 1)
        self.assertIsNone(settings.opencode_bin)
        self.assertFalse(self.load({"OPENCODE_URL": ""}).managed)
        self.assertEqual(self.load({"OPENCODE_URL": ""}).opencode_urls, ())
        self.assertFalse(self.load({"OPENCODE_URL": "http://127.0.0.1:4242"}).managed)
        custom = self.load({"SANDBOX_OPENCODE_BIN": "/opt/oc", "SANDBOX_OPENCODE_SERVERS": "2"})
        self.assertEqual((custom.opencode_bin, custom.opencode_servers), ("/opt/oc", 2))
        self.assertConfigError({"SANDBOX_OPENCODE_SERVERS": "0"}, names="SANDBOX_OPENCODE_SERVERS")
        self.assertEqual(settings.opencode_username, "opencode")
        self.assertIsNone(settings.opencode_password)

    def test_environment(self):
        settings = self.load(
            {
                "SANDBOX_HOST": "127.0.0.1",
                "SANDBOX_PORT": "5000",
                "SANDBOX_PASSWORD": "s3",
                "SANDBOX_REQUEST_TIMEOUT_MS": "1500",
                "OPENCODE_URL": "http://oc:1",
                "OPENCODE_SERVER_USERNAME": "me",
                "OPENCODE_SERVER_PASSWORD": "pw",
            }
        )
        self.assertEqual(settings.ports, ("tcp:5000:interface=127.0.0.1",))
        self.assertEqual(settings.password, "s3")
        self.assertEqual(settings.request_timeout, 1.5)
        self.assertEqual(settings.opencode_url, "http://oc:1")
        self.assertEqual(settings.opencode_username, "me")
        self.assertEqual(settings.opencode_password, "pw")

    def test_ipv6_host_is_escaped(self):
        self.assertEqual(self.load({"SANDBOX_HOST": "::"}).ports, (r"tcp:4444:interface=\:\:",))

    def test_opencode_username_alias(self):
        self.assertEqual(self.load({"OPENCODE_USERNAME": "alt"}).opencode_username, "alt")

    def test_options_override_environment(self):
        settings = self.load(
            {"SANDBOX_PORT": "5000", "SANDBOX_PASSWORD": "env", "OPENCODE_URL": "http://a:1"},
            "--port",
            "tcp:6000",
            "-p",
            "unix:/tmp/gw.sock",
            "--password",
            "opt",
            "--opencode-url",
            "http://b:2",
            "--request-timeout-ms",
            "2000",
        )
        self.assertEqual(settings.ports, ("tcp:6000", "unix:/tmp/gw.sock"))
        self.assertEqual(settings.password, "opt")
        self.assertEqual(settings.opencode_url, "http://b:2")
        self.assertEqual(settings.request_timeout, 2)

    def test_password_file(self):
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("from-file\n")
        settings = self.load({"SANDBOX_PASSWORD_FILE": path, "SANDBOX_PASSWORD": "env"})
        self.assertEqual(settings.password, "from-file")
        self.assertEqual(self.load({}, "--password-file", path).password, "from-file")

    def test_password_file_errors(self):
        self.assertConfigError(
            {"SANDBOX_PASSWORD_FILE": "/nonexistent/pw"}, names="SANDBOX_PASSWORD_FILE"
        )
        path = self.mktemp()
        open(path, "w").close()
        self.assertConfigError({}, "--password-file", path, names="is empty")

    def test_empty_password_is_refused(self):
        self.assertConfigError({"SANDBOX_PASSWORD": ""}, names="SANDBOX_PASSWORD")

    def test_secrets_stay_out_of_repr(self):
        settings = self.load({"SANDBOX_PASSWORD": "hunter2", "OPENCODE_SERVER_PASSWORD": "pw9"})
        self.assertNotIn("hunter2", repr(settings))
        self.assertNotIn("pw9", repr(settings))

    def test_bad_values_name_the_setting(self):
        for environ, name in (
            ({"SANDBOX_PORT": "abc"}, "SANDBOX_PORT"),
            ({"SANDBOX_PORT": "70000"}, "SANDBOX_PORT"),
            ({"SANDBOX_REQUEST_TIMEOUT_MS": "0"}, "SANDBOX_REQUEST_TIMEOUT_MS"),
            ({"SANDBOX_REQUEST_TIMEOUT_MS": "soon"}, "SANDBOX_REQUEST_TIMEOUT_MS"),
            ({"SANDBOX_REQUEST_TIMEOUT_MS": "inf"}, "SANDBOX_REQUEST_TIMEOUT_MS"),
            ({"OPENCODE_URL": "ftp://x"}, "OPENCODE_URL"),
            ({"OPENCODE_URL": "not a url"}, "OPENCODE_URL"),
        ):
            self.assertConfigError(environ, names=name)
        self.assertConfigError({}, "--request-timeout-ms", "-5", names="--request-timeout-ms")

    def test_cluster_mode_without_txredisapi_says_what_to_install(self):
        environ = {"SANDBOX_REDIS_URL": "redis://:secret-pw@127.0.0.1:6379/0"}
        self.assertEqual(self.load(environ).redis_url, environ["SANDBOX_REDIS_URL"])
        with mock.patch.dict(sys.modules, {"txredisapi": None}):
            message = self.assertConfigError(environ, names="SANDBOX_REDIS_URL")
        self.assertIn("pip install 'trapsandbox[cluster]'", message)
        self.assertNotIn("secret-pw", message)

    def test_trusted_proxies(self):
        self.assertEqual(self.load().trusted_proxies, ())
        settings = self.load({"SANDBOX_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8"})
        self.assertEqual(
            settings.trusted_proxies,
            (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8")),
        )
        # The option wins.
        settings = self.load(
            {"SANDBOX_TRUSTED_PROXIES": "127.0.0.1"}, "--trusted-proxies", "::1,unix"
        )
        self.assertEqual(settings.trusted_proxies, (ipaddress.ip_network("::1/128"), "unix"))

    def test_bad_trusted_proxies_name_the_setting_and_the_entry(self):
        message = self.assertConfigError(
            {"SANDBOX_TRUSTED_PROXIES": "127.0.0.1, proxy.local"}, names="SANDBOX_TRUSTED_PROXIES"
        )
        self.assertIn("'proxy.local'", message)
        self.assertConfigError({}, "--trusted-proxies", "10.0.0.0/33", names="--trusted-proxies")

    def test_admin_token(self):
        self.assertIsNone(self.load().admin_token)
        self.assertEqual(self.load({"SANDBOX_ADMIN_TOKEN": "t0k"}).admin_token, "t0k")
        self.assertEqual(
            self.load({"SANDBOX_ADMIN_TOKEN": "env"}, "--admin-token", "opt").admin_token, "opt"
        )
        path = self.mktemp()
        with open(path, "w") as f:
            f.write("from-file\n")
        for environ, argv in (
            ({"SANDBOX_ADMIN_TOKEN_FILE": path, "SANDBOX_ADMIN_TOKEN": "env"}, ()),
            ({}, ("--admin-token-file", path)),
        ):
            self.assertEqual(self.load(environ, *argv).admin_token, "from-file")

    def test_bad_admin_tokens(self):
        for environ, argv, name in (
            ({"SANDBOX_ADMIN_TOKEN": ""}, (), "SANDBOX_ADMIN_TOKEN is empty"),
            ({"SANDBOX_ADMIN_TOKEN": "two words"}, (), "SANDBOX_ADMIN_TOKEN must be"),
            ({}, ("--admin-token", "caf\u00e9"), "--admin-token must be"),
            ({"SANDBOX_ADMIN_TOKEN_FILE": "/nonexistent/t"}, (), "SANDBOX_ADMIN_TOKEN_FILE"),
        ):
            message = self.assertConfigError(environ, *argv, names=name)
            self.assertNotIn("two words", message)

    def test_admin_token_stays_out_of_repr(self):
        self.assertNotIn("t0k3n", repr(self.load({"SANDBOX_ADMIN_TOKEN": "t0k3n"})))

    def test_several_opencode_servers(self):
        settings = self.load({"OPENCODE_URL": " http://a:1, http://b:2 "})
        self.assertEqual(settings.opencode_urls, ("http://a:1", "http://b:2"))
        self.assertEqual(settings.opencode_url, "http://a:1,http://b:2")
        self.assertEqual(self.load({"OPENCODE_URL": "http://a:1"}).opencode_urls, ("http://a:1",))
        self.assertEqual(self.load({"OPENCODE_URL": ""}).opencode_urls, ())
        error = self.assertConfigError({"OPENCODE_URL": "http://a:1,ftp://b"}, names="OPENCODE_URL")
        self.assertIn("'ftp://b'", error)
        self.assertConfigError({}, "--opencode-url", "http://a:1,http://a:1", names="twice")

    def test_empty_opencode_url_is_allowed(self):
        self.assertEqual(self.load({"OPENCODE_URL": ""}).opencode_url, "")

    def test_unknown_option(self):
        with self.assertRaises(usage.UsageError):
            options("--nope")

    def test_limits(self):
        settings = self.load({"SANDBOX_MAX_CONNECTIONS": "500"})
        self.assertEqual(settings.max_connections, 500)
        self.assertEqual(settings.max_unauthenticated_per_address, 256)
        settings = self.load({}, "--max-unauthenticated-per-address", "8")
        self.assertEqual(settings.max_unauthenticated_per_address, 8)
        for value in ("0", "-3", "many"):
            self.assertConfigError(
                {"SANDBOX_MAX_CONNECTIONS": value}, names="SANDBOX_MAX_CONNECTIONS"
            )
        self.assertConfigError(
            {}, "--max-unauthenticated-per-address", "x", names="--max-unauthenticated-per-address"
        )

    def test_operator_sockets_per_account(self):
        self.assertEqual(self.load({}).max_operator_sockets_per_account, 16)
        settings = self.load({"SANDBOX_MAX_OPERATOR_SOCKETS_PER_ACCOUNT": "3"})
        self.assertEqual(settings.max_operator_sockets_per_account, 3)
        settings = self.load({}, "--max-operator-sockets-per-account", "5")
        self.assertEqual(settings.max_operator_sockets_per_account, 5)
        self.assertConfigError(
            {"SANDBOX_MAX_OPERATOR_SOCKETS_PER_ACCOUNT": "0"},
            names="SANDBOX_MAX_OPERATOR_SOCKETS_PER_ACCOUNT",
        )

    def test_state_directory(self):
        self.assertEqual(self.load().state_dir, "state")  # ./state of the working directory
        self.assertEqual(self.load({"SANDBOX_STATE_DIR": "/var/lib/ts"}).state_dir, "/var/lib/ts")
        self.assertEqual(
            self.load({"SANDBOX_STATE_DIR": "/env"}, "--state-dir", "/opt").state_dir, "/opt"
        )
        self.assertConfigError({"SANDBOX_STATE_DIR": ""}, names="SANDBOX_STATE_DIR")
        self.assertConfigError({}, "--state-dir", "a\0b", names="--state-dir")

    def test_ask_conversations_per_account(self):
        self.assertEqual(self.load().max_ask_conversations, 256)
        settings = self.load({"SANDBOX_MAX_ASK_CONVERSATIONS": "3"})
        self.assertEqual(settings.max_ask_conversations, 3)
        self.assertEqual(self.load({}, "--max-ask-conversations", "9").max_ask_conversations, 9)
        for value in ("0", "many"):
            self.assertConfigError(
                {"SANDBOX_MAX_ASK_CONVERSATIONS": value}, names="SANDBOX_MAX_ASK_CONVERSATIONS"
            )

    def test_ask_instances_and_queue(self):
        """opencode instances given back and asks queued (``opencode.instances``, ``queue``)."""
        settings = self.load()
        self.assertEqual(settings.ask_instance_idle, 600.0)
        self.assertEqual(
            (settings.ask_max_instances, settings.ask_max_running),
            (32, 16),
        )
        self.assertEqual(settings.ask_max_running_per_account, 4)
        settings = self.load(
            {"SANDBOX_ASK_INSTANCE_IDLE_MS": "1500", "SANDBOX_ASK_MAX_INSTANCES": "8"},
            "--ask-max-running",
            "8",
            "--ask-max-running-per-account",
            "2",
        )
        self.assertEqual(settings.ask_instance_idle, 1.5)
        self.assertEqual(settings.ask_max_instances, 8)
        self.assertEqual(settings.ask_max_running, 8)
        self.assertEqual(settings.ask_max_running_per_account, 2)
        for name in (
            "SANDBOX_ASK_INSTANCE_IDLE_MS",
            "SANDBOX_ASK_MAX_INSTANCES",
            "SANDBOX_ASK_MAX_RUNNING",
            "SANDBOX_ASK_MAX_RUNNING_PER_ACCOUNT",
        ):
            for value in ("0", "lots"):
                self.assertConfigError({name: value}, names=name)
        error = self.assertConfigError(
            {"SANDBOX_ASK_MAX_INSTANCES": "4"}, names="SANDBOX_ASK_MAX_RUNNING (16)"
        )
        self.assertIn("must not exceed SANDBOX_ASK_MAX_INSTANCES (4)", error)

    def test_snapshot_settings(self):
        """SPEC §15: kept per computer, MiB per account, MiB of one snapshot."""
        settings = self.load()
        self.assertEqual(
            settings.snapshot_store_settings(),
            {"keep": 10, "quota": 64 * 2**20, "max_bytes": 4 * 2**20},
        )
        settings = self.load(
            {
                "SANDBOX_SNAPSHOTS_KEEP": "3",
                "SANDBOX_SNAPSHOT_QUOTA_MB": "128",
                "SANDBOX_SNAPSHOT_MAX_MB": "0.5",
            }
        )
        self.assertEqual(
            settings.snapshot_store_settings(),
            {"keep": 3, "quota": 128 * 2**20, "max_bytes": 2**19},
        )
        argv = ("--snapshots-keep", "5", "--snapshot-quota-mb", "1", "--snapshot-max-mb", "2")
        settings = self.load({"SANDBOX_SNAPSHOTS_KEEP": "3"}, *argv)
        self.assertEqual(
            settings.snapshot_store_settings(), {"keep": 5, "quota": 2**20, "max_bytes": 2 * 2**20}
        )

    def test_bad_snapshot_settings_name_the_setting(self):
        for value in ("0", "-1", "ten", "1.5", ""):
            message = self.assertConfigError(
                {"SANDBOX_SNAPSHOTS_KEEP": value}, names="SANDBOX_SNAPSHOTS_KEEP"
            )
            self.assertIn("whole number of at least 1", message)
        for name in ("SANDBOX_SNAPSHOT_QUOTA_MB", "SANDBOX_SNAPSHOT_MAX_MB"):
            for value in ("0", "-4", "lots", "nan", "inf", "", "1e-9"):
                message = self.assertConfigError({name: value}, names=name)
                self.assertIn("positive number of MiB", message)
        self.assertConfigError({}, "--snapshot-max-mb", "x", names="--snapshot-max-mb")
