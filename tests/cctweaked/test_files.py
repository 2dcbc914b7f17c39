"""
Changes of files on CC:Tweaked's own core (issue 43, "Nothing lost"): two saves of one file
at once from two ``/operator`` sockets leave one of them whole, a move into itself however
it is spelt deletes nothing, and making a folder that exists touches nothing in it.  The
real ``lua/`` client, the real gateway on loopback, the game's own filesystem.
"""

from __future__ import annotations

import base64

from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase

from tests.cctweaked.test_client import CCTGatewayMixin
from tests.harness.callers import asking
from tests.harness.support import bounded, connect_operator

SIZE = 200_000
# A write of SIZE bytes on CC:Tweaked's core, ticked at 20 a second, is a few seconds.
WRITE_WAIT = 90


class FileChangeTests(CCTGatewayMixin, TestCase):
    async def connected(self):
        c = self.computer()
        await self.started(c)
        return c

    async def final(self, operator, request_id):
        """``operator``'s final answer to ``request_id`` (partials skipped)."""
        while True:
            message = await bounded(operator.messages.get(), WRITE_WAIT)
            if message.get("id") == request_id and not message.get("partial"):
                return message

    def finishing(self) -> list[bytes]:
        """The first byte of each write the gateway finishes, in the order it answers them.
        (Not the order the answers arrive here: two sockets' answers waiting at once are read
        in the order of their descriptors.)"""
        finished: list[bytes] = []
        write_file = self.sandbox.write_file

        def noted(caller, path, content, **kwargs):
            d = write_file(caller, path, content, **kwargs)
            return d.addCallback(lambda answer: finished.append(content[:1]) or answer)

        self.patch(self.sandbox, "write_file", noted)
        return finished

    def temporaries(self, c):
        return sorted(p.name for p in c.root.iterdir() if p.name.endswith(".sandbox-part"))

    async def test_two_saves_of_one_file_at_once_leave_one_of_them_whole(self):
        c = await self.connected()
        first = await connect_operator(self, self.port)
        second = await connect_operator(self, self.port)
        finished = self.finishing()
        for trial in range(3):
            c.write_file("/f.bin", b"old")
            del finished[:]
            waits = []
            for operator, letter in ((first, b"A"), (second, b"B")):
                request_id = f"{trial}{letter.decode()}"
                operator.send(
                    {"id": request_id, "traposId": c.trapos_id, "type": "file_write",
                     "payload": {"path": "/f.bin",
                                 "content": base64.b64encode(letter * SIZE).decode()}}
                )  # fmt: skip
                waits.append(self.final(operator, request_id))
            answers = await gatherResults([Deferred.fromCoroutine(w) for w in waits])
            for answer in answers:
                self.assertEqual(answer.get("payload"), {"bytesWritten": SIZE, "sizeBytes": SIZE})
            on_disk = c.read_file("/f.bin")
            self.assertIn(on_disk, (b"A" * SIZE, b"B" * SIZE), f"trial {trial}: mixed")
            # The save answered last is the one on disk.
            self.assertEqual(sorted(finished), [b"A", b"B"])
            self.assertEqual(on_disk[:1], finished[-1], (trial, finished))
            self.assertEqual(self.temporaries(c), [])

    async def test_writers_the_gateway_does_not_order_still_never_mix(self):
        # As another gateway process's writes would be (cluster mode): no gateway lock, so
        # only the computer's temporary file per write keeps them apart.
        c = await self.connected()
        caller = asking(c.trapos_id)
        arrived: list = []

        def noted(letter):
            def note(answer):
                arrived.append(letter)
                return answer

            return note

        writes = [
            self.sandbox.write_file(caller, "/g.bin", letter * SIZE, lock=False).addCallback(
                noted(letter)
            )
            for letter in (b"A", b"B")
        ]
        await bounded(gatherResults(writes), WRITE_WAIT)
        on_disk = c.read_file("/g.bin")
        self.assertIn(on_disk, (b"A" * SIZE, b"B" * SIZE), "mixed")
        self.assertEqual(on_disk[:1], arrived[-1])
        self.assertEqual(self.temporaries(c), [])

    async def test_a_move_into_itself_however_spelt_is_refused_and_deletes_nothing(self):
        c = self.computer()
        c.write_file("/proj/a.lua", "a")
        c.write_file("/proj/sub/b.lua", "b")
        c.write_file("/other/keep.txt", "k")
        await self.started(c)
        operator = await connect_operator(self, self.port)
        for n, to in enumerate(["/other/../proj/inner", "proj/./sub/x", "\\proj\\y", "/PROJ/z"]):
            operator.send({"id": n, "traposId": c.trapos_id, "type": "file_move",
                           "payload": {"from": "/proj", "to": to}})  # fmt: skip
            answer = await operator.next_message()
            self.assertEqual((answer["id"], answer.get("status")), (n, 400), answer)
            self.assertIn("inside it", answer["error"]["message"])
        self.assertEqual((c.read_file("/proj/a.lua"), c.read_file("/proj/sub/b.lua")), (b"a", b"b"))
        # A move the rule allows is done on the computer in one step.
        operator.send({"id": "ok", "traposId": c.trapos_id, "type": "file_move",
                       "payload": {"from": "/proj", "to": "/other/../moved/proj"}})  # fmt: skip
        answer = await operator.next_message()
        self.assertEqual(answer.get("payload"), {"moved": ["/moved/proj"]}, answer)
        self.assertEqual(c.read_file("/moved/proj/sub/b.lua"), b"b")
        self.assertFalse(c.path("/proj").exists())
        # And an existing target is refused, not overwritten.
        operator.send({"id": "exists", "traposId": c.trapos_id, "type": "file_move",
                       "payload": {"from": "/moved", "to": "/other"}})  # fmt: skip
        answer = await operator.next_message()
        self.assertEqual(answer["error"]["code"], "fs_error", answer)
        self.assertEqual(c.read_file("/other/keep.txt"), b"k")
        self.assertEqual(c.read_file("/moved/proj/a.lua"), b"a")

    async def test_making_a_folder_that_exists_touches_nothing_in_it(self):
        c = self.computer()
        c.write_file("/proj/.folder", "the player's own")
        await self.started(c)
        operator = await connect_operator(self, self.port)
        for n, path in enumerate(["/proj", "/x/../proj/", "/new/folder"]):
            operator.send({"id": n, "traposId": c.trapos_id, "type": "folder_make",
                           "payload": {"path": path}})  # fmt: skip
            answer = await operator.next_message()
            self.assertEqual(answer["id"], n)
            self.assertIn("payload", answer, answer)
        self.assertEqual(c.read_file("/proj/.folder"), b"the player's own")
        self.assertTrue(c.path("/new/folder").is_dir())
        self.assertEqual(list(c.path("/new/folder").iterdir()), [])
