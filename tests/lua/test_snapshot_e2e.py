"""
Snapshots (SPEC §15) on the CraftOS harness: the real client lists its files for the
gateway, and the gateway takes, compares and restores snapshots of them.
"""

import os

from twisted.trial.unittest import TestCase

from tests.harness.callers import asking
from tests.lua.test_lua_e2e import GatewayMixin
from trapsandbox.computers import wire
from trapsandbox.errors import GatewayError

ALL = "exec,eval,fs.read,fs.write"


class SnapshotListTests(GatewayMixin, TestCase):
    async def ready(self, allow=ALL, label="sn"):
        c = self.computer(label=label)
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        return c

    def ask(self, c, type, payload=None):
        return self.gateway.registry.request(
            asking(f"7:{c.label}"), type, payload or {}, timeout=20
        )

    async def test_lists_every_file_with_size_and_time_outside_rom_and_settings(self):
        c = await self.ready()
        c.write_file("/a.txt", "hello")
        c.write_file("/d/e/f/deep.bin", bytes(range(256)) * 3)
        c.write_file("/d/empty", b"")
        os.makedirs(c.root / "emptydir")
        answer = await self.ask(c, "snapshot_list")
        self.assertTrue(answer.ok, answer.error)
        files = {f["path"]: f for f in answer.payload["files"]}
        self.assertNotIn("/.settings", files)
        self.assertFalse([p for p in files if p.startswith("/rom")])
        for path, size in {"/a.txt": 5, "/d/e/f/deep.bin": 768, "/d/empty": 0}.items():
            self.assertEqual(files[path]["size"], size, path)
            mtime = int(os.stat(c.root / path.lstrip("/")).st_mtime * 1000)
            self.assertEqual(files[path]["modified"], mtime, path)
        self.assertNotIn("/emptydir", files)
        self.assertEqual(answer.payload["total"], sum(f["size"] for f in files.values()))

    async def test_a_mounted_drive_is_left_out(self):
        c = await self.ready()
        c.write_file("/disk/on-the-floppy.txt", "not ours")
        c.write_file("/mine.txt", "ours")
        # The harness has no disk drive: its fs answers like one for /disk.
        c.eval(
            "local real = fs.getDrive "
            "fs.getDrive = function(p) "
            "if fs.combine(p, '') == 'disk' or fs.combine(p, ''):find('^disk/') then "
            "return 'bottom' end return real(p) end"
        )
        answer = await self.ask(c, "snapshot_list")
        paths = [f["path"] for f in answer.payload["files"]]
        self.assertIn("/mine.txt", paths)
        self.assertFalse([p for p in paths if p.startswith("/disk")], paths)

    async def test_hundreds_of_files_in_batches_with_other_requests_answered(self):
        c = await self.ready()
        for i in range(300):
            c.write_file(f"/many/{i // 50}/f{i}.txt", f"file {i}")
        listing = self.ask(c, "snapshot_list")
        ping = await self.ask(c, "ping")
        self.assertTrue(ping.ok)
        answer = await listing
        self.assertTrue(answer.ok, answer.error)
        paths = [f["path"] for f in answer.payload["files"]]
        self.assertEqual(len([p for p in paths if p.startswith("/many/")]), 300)

    async def test_a_listing_over_one_frame_is_refused_plainly(self):
        c = await self.ready()
        name = "x" * 200
        for i in range(700):
            c.write_file(f"/big/{i}{name}", "")
        answer = await self.ask(c, "snapshot_list")
        self.assertEqual((answer.ok, answer.error.code), (False, "too_large"))
        self.assertIn("files", answer.error.message)
        self.assertIn("delete some files", answer.error.message)

    async def test_needs_fs_read(self):
        c = await self.ready(allow="exec")
        error = await self.assertFailure(self.ask(c, "snapshot_list"), GatewayError)
        self.assertEqual(error.code, "forbidden")
        # The computer refuses it too (defence in depth).
        self.patch(wire, "CAPABILITY_OF", {})
        answer = await self.ask(c, "snapshot_list")
        self.assertEqual((answer.ok, answer.error.code), (False, "forbidden"))


def tree(c):
    """The computer's files as the harness sees them (path -> bytes), /rom and /.settings
    and the client's own files left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(c.root):
        rel = os.path.relpath(dirpath, c.root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in ("rom", "apis", "servers", "programs")]
        for name in filenames:
            path = "/" + os.path.normpath(os.path.join(rel, name)).lstrip("./")
            if path != "/.settings":
                with open(os.path.join(dirpath, name), "rb") as f:
                    out[path] = f.read()
    return out


class SnapshotServiceTests(GatewayMixin, TestCase):
    """``Snapshots`` (take, changes, restore) against the real client."""

    async def ready(self, allow=ALL, label="sv"):
        c = self.computer(label=label)
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        await self.gateway.snapshots.ready()
        return c

    async def test_take_edit_changes_restore_and_undo_the_undo(self):
        c = await self.ready()
        snapshots = self.gateway.snapshots
        c.write_file("/notes.txt", "one\ntwo\nthree\n")
        c.write_file("/bin/blob.bin", bytes(range(256)) * 10)
        c.write_file("/deep/a/b/c.lua", "print('c')")
        c.write_file("/gone.txt", "will be deleted")
        first = await snapshots.take(asking("7:sv", "local"), "manual")
        self.assertEqual(first["fetched"], first["files"])
        original = tree(c)

        # Nothing changed: nothing travels.
        again = await snapshots.take(asking("7:sv", "local"), "manual")
        self.assertEqual(again["fetched"], 0)

        c.write_file("/notes.txt", "one\n2\nthree\n")
        c.write_file("/bin/blob.bin", b"\x00\xff" * 100)
        c.write_file("/new/dir/added.txt", "new")
        os.remove(c.root / "gone.txt")
        found = await snapshots.changes(asking("7:sv", "local"), first["id"])
        self.assertEqual([a["path"] for a in found["added"]], ["/new/dir/added.txt"])
        self.assertEqual([m["path"] for m in found["modified"]], ["/bin/blob.bin", "/notes.txt"])
        self.assertEqual(found["deleted"], [{"path": "/gone.txt", "before": 15, "after": None}])
        diffs = {d["path"]: d["diff"] for d in found["diffs"]}
        self.assertIn("-two\n+2", diffs["/notes.txt"])
        self.assertIn("binary", diffs["/bin/blob.bin"])
        edited = tree(c)

        done = await snapshots.restore(asking("7:sv", "local"), first["id"])
        self.assertEqual(done["deleted"], ["/new/dir/added.txt"])
        self.assertEqual(sorted(done["written"]), ["/bin/blob.bin", "/gone.txt", "/notes.txt"])
        self.assertEqual(tree(c), original)

        # The undo is undone from the snapshot it took first.
        await snapshots.restore(asking("7:sv", "local"), done["before"])
        self.assertEqual(tree(c), edited)
        listed = await snapshots.list(asking("7:sv", "local"))
        self.assertEqual([s["reason"] for s in listed][:2], ["restore", "restore"])
        self.assertEqual(c.violations, [])

    async def test_over_the_bound_nothing_is_saved(self):
        c = await self.ready()
        self.gateway.snapshots.store().max_bytes = 1000
        c.write_file("/big.bin", b"x" * 2000)
        error = await self.assertFailure(
            self.gateway.snapshots.take(asking("7:sv", "local"), "manual"), GatewayError
        )
        self.assertEqual(error.code, "too_large")
        self.assertIn("a snapshot holds at most 1000", error.message)
        self.assertIn("SANDBOX_SNAPSHOT_MAX_MB", error.message)
        self.assertEqual(await self.gateway.snapshots.list(asking("7:sv", "local")), [])

    async def test_another_accounts_snapshot_is_not_found(self):
        c = await self.ready()
        c.write_file("/a.txt", "a")
        taken = await self.gateway.snapshots.take(asking("7:sv", "local"), "manual")
        error = await self.assertFailure(
            self.gateway.snapshots.changes(asking("7:sv", "other"), taken["id"]), GatewayError
        )
        self.assertEqual(error.code, "not_found")


class CtlTests(GatewayMixin, TestCase):
    """``trapsandbox-ctl snapshots|snapshot|changes|restore`` (real processes) on the harness."""

    async def run_ctl(self, *args, code=0):
        child = self.ctl(*args)
        self.assertEqual(await child.wait_ended(30), code, child.output)
        return child.output

    async def test_snapshot_changes_restore_and_list(self):
        c = self.computer(label="ct")
        c.set_settings({"sandbox.allow": ALL})
        await self.start_daemon(c)
        await self.gateway.snapshots.ready()
        self.assertIn("has no snapshots", await self.run_ctl("snapshots", "7:ct"))
        c.write_file("/notes.txt", "one\ntwo\n")
        out = await self.run_ctl("snapshot", "7:ct")
        self.assertRegex(out, r"snapshot 1 of 7:ct: \d+ files, \d+ bytes \(\d+ fetched\)")
        c.write_file("/notes.txt", "one\n2\n")
        c.write_file("/added.lua", "x")
        out = await self.run_ctl("changes", "7:ct", "1")
        self.assertIn("2 changes on 7:ct since snapshot 1", out)
        self.assertIn("added     /added.lua (1 bytes)", out)
        self.assertIn("modified  /notes.txt (8 -> 6 bytes)", out)
        self.assertIn("+2", out)
        out = await self.run_ctl("restore", "7:ct", "1")
        self.assertIn("restored 7:ct to snapshot 1: 1 written, 1 deleted", out)
        self.assertIn("undo with: trapsandbox-ctl restore 7:ct 2", out)
        self.assertEqual(c.read_file("/notes.txt"), b"one\ntwo\n")
        self.assertIsNone(c.read_file("/added.lua"))
        out = await self.run_ctl("snapshots", "7:ct")
        self.assertIn("restore", out)
        self.assertIn("manual", out)
        out = await self.run_ctl("changes", "7:ct", "99", code=1)
        self.assertIn("not_found: no snapshot 99 of this computer", out)


class InGameTests(GatewayMixin, TestCase):
    """``sandbox snapshots``, ``sandbox changes`` and ``sandbox undo`` on the computer."""

    async def ready(self, allow=ALL):
        c = self.computer(label="ig")
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        await self.gateway.snapshots.ready()
        return c

    async def test_changes_then_undo_with_yes(self):
        c = await self.ready()
        c.write_file("/notes.txt", "one\ntwo\n")
        # What the ask hook does before an ask's first change.
        await self.gateway.snapshots.take(asking("7:ig", "local"), "ask")
        c.write_file("/notes.txt", "changed\n")
        c.write_file("/made/by/agent.lua", "print(1)")
        await c.run("/programs/sandbox.lua changes").done
        self.assertIn("added    /made/by/agent.lua", c.output)
        self.assertIn("modified /notes.txt", c.output)
        self.assertIn("2 changes since snapshot 1", c.output)

        proc = c.run("/programs/sandbox.lua undo")
        c.focus(proc)  # keys go to the focused tab
        await c.wait_for_output("Undo these changes? [y/N]")
        c.type_line("y")
        await proc.done
        self.assertIn("restored snapshot 1: 1 written, 1 deleted", c.output)
        self.assertIn("to undo this: sandbox undo 2", c.output)
        self.assertEqual(c.read_file("/notes.txt"), b"one\ntwo\n")
        self.assertIsNone(c.read_file("/made/by/agent.lua"))

        await c.run("/programs/sandbox.lua snapshots").done
        self.assertRegex(c.output, r"2 \S+ \S+ restore")
        self.assertRegex(c.output, r"1 \S+ \S+ ask")
        self.assertEqual(c.violations, [])

    async def test_undo_answered_no_changes_nothing(self):
        c = await self.ready()
        await self.gateway.snapshots.take(asking("7:ig", "local"), "ask")
        c.write_file("/new.txt", "x")
        proc = c.run("/programs/sandbox.lua undo")
        c.focus(proc)  # keys go to the focused tab
        await c.wait_for_output("Undo these changes? [y/N]")
        c.type_line("")
        await proc.done
        self.assertIn("nothing changed", c.output)
        self.assertEqual(c.read_file("/new.txt"), b"x")

    async def test_no_ask_yet_and_no_consent_say_so(self):
        c = await self.ready(allow="fs.read")
        await c.run("/programs/sandbox.lua changes").done
        self.assertIn("no ask has changed files on this computer yet", c.output)
        await self.gateway.snapshots.take(asking("7:ig", "local"), "ask")
        c.write_file("/new.txt", "x")
        proc = c.run("/programs/sandbox.lua undo")
        c.focus(proc)  # keys go to the focused tab
        await c.wait_for_output("Undo these changes? [y/N]")
        c.type_line("y")
        await proc.done
        self.assertIn('has not allowed fs.write: on it, run "sandbox allow fs.write"', c.output)
        self.assertEqual(c.read_file("/new.txt"), b"x")
