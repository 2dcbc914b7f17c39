"""
The state directory and the private directories and files in it (SPEC §5,
§11): made 0700, another user's refused, never written through a link.
"""

import os
import stat

from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import state
from trapsandbox.errors import ConfigError

NOBODY = 65534


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def owned_by_nobody(testcase, path):
    """``path`` handed to another user, as only root can; the test is skipped otherwise."""
    if os.geteuid() != 0:
        testcase.skipTest("only root can give a directory to another user")
    os.chown(path, NOBODY, NOBODY)


class PrepareTests(SynchronousTestCase):
    def test_a_missing_directory_is_made_0700_and_relative_is_from_the_working_directory(self):
        path = os.path.join(self.mktemp(), "deeper", "state")
        made = state.prepare(os.path.relpath(path), "SANDBOX_STATE_DIR")
        self.assertEqual(made, os.path.abspath(path))
        self.assertEqual(mode(path), 0o700)

    def test_an_existing_directory_of_ours_is_made_0700(self):
        path = self.mktemp()
        os.mkdir(path)
        os.chmod(path, 0o777)
        state.prepare(path, "SANDBOX_STATE_DIR")
        self.assertEqual(mode(path), 0o700)

    def test_another_users_directory_stops_the_daemon_naming_the_setting(self):
        path = os.path.abspath(self.mktemp())
        os.mkdir(path, 0o755)
        owned_by_nobody(self, path)
        with self.assertRaises(ConfigError) as raised:
            state.prepare(path, "SANDBOX_STATE_DIR")
        message = str(raised.exception)
        self.assertTrue(message.startswith("SANDBOX_STATE_DIR: " + path), message)
        self.assertIn("belongs to another user", message)
        self.assertEqual(mode(path), 0o755)  # left as it was

    def test_a_file_in_the_way(self):
        path = self.mktemp()
        open(path, "w").close()
        with self.assertRaises(ConfigError) as raised:
            state.prepare(path, "SANDBOX_ASK_DIR")
        self.assertIn("SANDBOX_ASK_DIR: cannot make the directory", str(raised.exception))

    def test_a_symbolic_link_to_a_directory_of_ours_is_followed(self):
        # systemd's DynamicUser= makes /var/lib/NAME a link to /var/lib/private/NAME.
        target = os.path.abspath(self.mktemp())
        os.mkdir(target)
        link = self.mktemp()
        os.symlink(target, link)
        state.prepare(link, "SANDBOX_STATE_DIR")
        self.assertEqual(mode(target), 0o700)


class PrivateDirectoryTests(SynchronousTestCase):
    def setUp(self):
        self.root = os.path.abspath(self.mktemp())
        os.mkdir(self.root, 0o700)

    def refused(self, name, reason):
        with self.assertRaises(state.Unsafe) as raised:
            with state.private_directory(self.root, name):
                self.fail("opened")
        self.assertIn(reason, str(raised.exception))
        return str(raised.exception)

    def test_made_0700(self):
        with state.private_directory(self.root, "7-abc") as fd:
            self.assertTrue(stat.S_ISDIR(os.fstat(fd).st_mode))
        self.assertEqual(mode(os.path.join(self.root, "7-abc")), 0o700)

    def test_an_existing_private_one_is_used(self):
        path = os.path.join(self.root, "d")
        os.mkdir(path, 0o700)
        with open(os.path.join(path, "kept"), "w"):
            pass
        with state.private_directory(self.root, "d") as directory:
            self.assertEqual(os.fstat(directory).st_ino, os.stat(path).st_ino)
            state.write_private(directory, "opencode.json", b"{}")
        self.assertEqual(sorted(os.listdir(path)), ["kept", "opencode.json"])
        self.assertEqual(mode(path), 0o700)

    def test_a_directory_writable_by_others_is_refused(self):
        path = os.path.join(self.root, "d")
        os.mkdir(path)
        os.chmod(path, 0o777)
        message = self.refused("d", "writable by group or others")
        self.assertIn(path, message)
        self.assertEqual(mode(path), 0o777)

    def test_another_users_directory_is_refused(self):
        path = os.path.join(self.root, "d")
        os.mkdir(path, 0o700)
        owned_by_nobody(self, path)
        self.refused("d", "belongs to another user")

    def test_a_symbolic_link_is_not_followed(self):
        target = os.path.abspath(self.mktemp())
        os.mkdir(target, 0o700)
        os.symlink(target, os.path.join(self.root, "d"))
        self.refused("d", "a symbolic link")

    def test_only_a_plain_name(self):
        for name in ("..", ".", "", "a/b", "../x"):
            self.refused(name, "not a plain directory name")


class WritePrivateTests(SynchronousTestCase):
    def setUp(self):
        self.root = os.path.abspath(self.mktemp())
        os.mkdir(self.root, 0o700)
        self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, self.fd)
        self.victim = os.path.abspath(self.mktemp())
        with open(self.victim, "wb") as f:
            f.write(b"the victim's")

    def test_written_0600_and_rewritten_whole(self):
        state.write_private(self.fd, "f.json", b"a longer first text")
        state.write_private(self.fd, "f.json", b"second")
        path = os.path.join(self.root, "f.json")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"second")
        self.assertEqual(mode(path), 0o600)

    def test_a_planted_symbolic_link_is_refused_and_its_target_untouched(self):
        os.symlink(self.victim, os.path.join(self.root, "f.json"))
        with self.assertRaises(state.Unsafe) as raised:
            state.write_private(self.fd, "f.json", b"token")
        self.assertIn("a symbolic link", str(raised.exception))
        with open(self.victim, "rb") as f:
            self.assertEqual(f.read(), b"the victim's")

    def test_a_planted_hard_link_is_refused_and_its_target_untouched(self):
        os.link(self.victim, os.path.join(self.root, "f.json"))
        with self.assertRaises(state.Unsafe):
            state.write_private(self.fd, "f.json", b"token")
        with open(self.victim, "rb") as f:
            self.assertEqual(f.read(), b"the victim's")
