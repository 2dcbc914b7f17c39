"""
Snapshots (SPEC §15) on the CraftOS harness: the real client lists its files for the
gateway, and the gateway takes, compares and restores snapshots of them.
"""

import os

from twisted.trial.unittest import TestCase

from tests.lua.test_lua_e2e import GatewayMixin
from trapsandbox.computers import wire
from trapsandbox.computers.wire import GatewayError

ALL = "exec,eval,fs.read,fs.write"


class SnapshotListTests(GatewayMixin, TestCase):
    async def ready(self, allow=ALL, label="sn"):
        c = self.computer(label=label)
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        return c

    def ask(self, c, type, payload=None):
        return self.gateway.registry.request(f"7:{c.label}", type, payload or {}, timeout=20)

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
