"""
The console's own ``/operator`` types (issue 34) on a real gateway: the agent's
ask (``web.agentcalls``) and a file change as one step (``web.filecalls``).
The full run with the real opencode is in ``tests/browser/test_agent.py``.
"""

import base64

import orjson
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from tests.harness.servers import Silent, listen
from tests.harness.support import (
    accounts_file,
    admitted,
    both_modes,
    bounded,
    connect_operator,
    start_gateway,
)
from trapsandbox import limits
from trapsandbox.admission import accounts

ADMIN = "admin-token-42"


class ConsoleCallsCase(TestCase):
    async def alice(self, capabilities=("exec", "fs.read", "fs.write"), features=None, **settings):
        """A gateway of accounts alice and bob (``settings`` added); alice's computer 7:si;
        alice's socket."""
        path = accounts_file(self, "alice", "bob")
        self.gateway = start_gateway(
            self, admin_token=ADMIN, accounts_file=path, accounts=accounts.load(path), **settings
        )
        port = self.gateway.port
        self.computer = await admitted(self, port, "s-alice", "7:si", capabilities, features)
        self.operator = await connect_operator(self, port, "token-alice")
        return self.computer, self.operator

    async def watcher(self):
        watcher = await connect_operator(self, self.gateway.port, "token-alice")
        watcher.send({"id": "w", "traposId": "7:si", "type": "watch_activity"})
        # (Held: the next message is the first entry.)
        return watcher

    async def entry(self, watcher):
        message = await watcher.next_message()
        self.assertEqual((message["id"], message.get("partial")), ("w", True), message)
        return message["payload"]["activity"]


class AgentCallsTests(ConsoleCallsCase):
    async def test_an_ask_streams_its_partials_and_is_one_entry_by_the_operator(self):
        computer, operator = await self.alice()
        watcher = await self.watcher()
        answer: Deferred = Deferred()
        called = []

        async def ask(account_id, trapos_id, capabilities, message_id, payload, emit, session=None):
            # opencode stands in here: what matters is what the socket makes of the partials.
            called.append((account_id, trapos_id, sorted(capabilities), payload))
            emit({"type": "text_delta", "text": "Let me look."})
            emit({"type": "tool", "name": "trapsandbox_run_command", "status": "running",
                  "detail": "ls /"})  # fmt: skip
            emit({"type": "question", "id": "que_1", "questions": [
                {"question": "Which file?", "options": []}]})  # fmt: skip
            return await answer

        self.gateway.asks.ask = ask
        operator.send({"id": "a1", "traposId": "7:si", "type": "ask",
                       "payload": {"prompt": "list my files"}})  # fmt: skip
        partials = [await operator.next_message() for _ in range(3)]
        self.assertEqual(
            [p["payload"] for p in partials],
            [
                {"type": "text_delta", "text": "Let me look."},
                {
                    "type": "tool",
                    "name": "trapsandbox_run_command",
                    "status": "running",
                    "detail": "ls /",
                },  # fmt: skip
                {
                    "type": "question",
                    "id": "que_1",
                    "questions": [{"question": "Which file?", "options": []}],
                },  # fmt: skip
            ],
        )
        self.assertTrue(all(p["id"] == "a1" and p["partial"] for p in partials))
        # The computer's own conversation: its account and traposId, what it allows.
        self.assertEqual(
            called,
            [("alice", "7:si", ["exec", "fs.read", "fs.write"], {"prompt": "list my files"})],
        )
        started = await self.entry(watcher)
        self.assertEqual(
            {k: started[k] for k in ("type", "detail", "by", "account", "state")},
            {
                "type": "ask",
                "detail": "list my files",
                "by": "operator",
                "account": "alice",
                "state": "started",
            },  # fmt: skip
        )
        running = [await self.entry(watcher) for _ in range(3)]
        self.assertEqual({e["n"] for e in running}, {started["n"]})
        self.assertEqual(running[1]["tool"], "trapsandbox_run_command")
        answer.callback({"sessionId": "ses_1", "text": "Let me look."})
        final = await operator.next_message()
        self.assertEqual(
            final,
            {
                "id": "a1",
                "status": 200,
                "ok": True,
                "payload": {"sessionId": "ses_1", "text": "Let me look."},
            },  # fmt: skip
        )
        ended = await self.entry(watcher)
        self.assertEqual((ended["n"], ended["state"]), (started["n"], "ok"))
        self.assertEqual(computer.messages.pending, [])  # nothing was sent to the computer

    async def test_bad_input_is_a_clear_400(self):
        _, operator = await self.alice()
        cases = [
            ("ask", {}, "prompt must be a non-empty string"),
            ("ask", {"prompt": "x" * (limits.MAX_PROMPT_CHARS + 1)}, "over"),
            ("ask", {"prompt": "hi", "new": "yes"}, "new and yes must be true or false"),
            ("ask_cancel", {}, "ask_cancel needs ask"),
            ("ask_permission", {"permissionId": "per_x", "response": "sure"}, "once, always"),
            ("ask_permission", {"permissionId": "per_x", "response": "once"}, "no permission"),
            ("ask_answer", {"questionId": 5, "answers": [["a"]]}, "no question"),
        ]
        for n, (kind, payload, said) in enumerate(cases):
            operator.send({"id": n, "traposId": "7:si", "type": kind, "payload": payload})
            answer = await operator.next_message()
            self.assertEqual(answer["id"], n)
            self.assertIn(answer["status"], (400, 413), answer)
            self.assertIn(said, answer["error"]["message"])
            self.assertNotIn("Traceback", orjson.dumps(answer).decode())

    async def test_one_ask_per_computer_and_cancel_stops_it(self):
        """
        The real ``Asks``: opencode (a server that accepts and never answers) never answers,
        so the first ask is still setting up; a second, from the page or the computer's own
        player, is refused.  (A closed port refused the first ask's event stream at once: on a
        loaded machine it had failed before the cancel came.)
        """
        silent = Silent()
        opencode = f"http://127.0.0.1:{listen(self, silent)}"
        computer, operator = await self.alice(opencode_url=opencode)
        watcher = await self.watcher()
        operator.send({"id": "a1", "traposId": "7:si", "type": "ask",
                       "payload": {"prompt": "first"}})  # fmt: skip
        started = await self.entry(watcher)
        self.assertEqual((started["type"], started["state"]), ("ask", "started"))
        operator.send({"id": "a2", "traposId": "7:si", "type": "ask",
                       "payload": {"prompt": "second"}})  # fmt: skip
        refused = await operator.next_message()
        self.assertEqual((refused["id"], refused["status"]), ("a2", 503))
        self.assertIn("an ask is already running on this computer", refused["error"]["message"])
        # The computer's own ask is the same conversation: refused too.
        mine = await bounded(computer.request("ask", {"prompt": "from the game"}))
        self.assertEqual(mine["error"]["code"], "overloaded")
        # An ask of another socket is not this socket's to name.
        other = await connect_operator(self, self.gateway.port, "token-alice")
        other.send({"id": 1, "traposId": "7:si", "type": "ask_cancel", "payload": {"ask": "a1"}})
        self.assertEqual((await other.next_message())["payload"], {"cancelled": False})
        operator.send({"id": 2, "traposId": "7:si", "type": "ask_cancel", "payload": {"ask": "a1"}})
        messages = [await bounded(operator.messages.get(), 20) for _ in range(2)]
        by_id = {m["id"]: m for m in messages}
        self.assertEqual(by_id[2]["payload"], {"cancelled": True})
        self.assertEqual(by_id["a1"]["error"]["code"], "cancelled")
        self.assertEqual(self.gateway.asks.runs, {})
        # Its activity entry ends cancelled (the refused ones ended overloaded meanwhile).
        while (entry := await self.entry(watcher))["n"] != started["n"]:
            self.assertIn(entry["state"], ("started", "overloaded"))
        self.assertEqual(entry["state"], "cancelled")
        # Free again: the computer may ask (it fails here only for want of opencode).
        operator.send({"id": "a3", "traposId": "7:si", "type": "ask",
                       "payload": {"prompt": "third"}})  # fmt: skip
        operator.send({"id": 3, "traposId": "7:si", "type": "ask_cancel", "payload": {"ask": "a3"}})
        messages = [await bounded(operator.messages.get(), 20) for _ in range(2)]
        self.assertEqual({m["id"] for m in messages}, {3, "a3"})

    async def test_a_computer_its_player_stopped_refuses_the_ask(self):
        computer, operator = await self.alice()
        said = await bounded(computer.request("stopped", {"stopped": True}))
        self.assertTrue(said["ok"], said)
        operator.send({"id": "a", "traposId": "7:si", "type": "ask", "payload": {"prompt": "hi"}})
        answer = await operator.next_message()
        self.assertEqual((answer["status"], answer["error"]["code"]), (409, "stopped"))
        self.assertIn("sandbox resume", answer["error"]["message"])
        self.assertEqual(self.gateway.asks.runs, {})

    async def test_closing_the_socket_stops_its_ask(self):
        _, operator = await self.alice()
        watcher = await self.watcher()
        operator.send({"id": "a", "traposId": "7:si", "type": "ask", "payload": {"prompt": "hi"}})
        started = await self.entry(watcher)
        self.assertIn(("alice", "7:si"), self.gateway.asks.runs)
        operator.sendClose(1000)
        await operator.wait_closed()
        ended = await bounded(watcher.messages.get(), 20)
        self.assertEqual(
            (ended["payload"]["activity"]["n"], ended["payload"]["activity"]["state"]),
            (started["n"], "cancelled"),
        )
        self.assertEqual(self.gateway.asks.runs, {})

    async def test_the_computer_disconnecting_ends_the_consoles_ask(self):
        """Issue 44: the console's ask on a computer ends when the computer's connection does
        (the operator's socket stays), freeing the computer for its next ask."""
        computer, operator = await self.alice()
        watcher = await self.watcher()
        operator.send({"id": "a", "traposId": "7:si", "type": "ask", "payload": {"prompt": "hi"}})
        await self.entry(watcher)
        self.assertIn(("alice", "7:si"), self.gateway.asks.runs)
        computer.sendClose(1000)
        await bounded(computer.closed)
        answer = await bounded(operator.messages.get(), 20)
        self.assertEqual((answer["id"], answer["error"]["code"]), ("a", "not_connected"))
        self.assertEqual(self.gateway.asks.runs, {})
        self.assertEqual(self.gateway.metrics._asks.labels("disconnected").value, 1)

    async def test_another_accounts_token_reaches_nothing_and_sees_nothing(self):
        _, operator = await self.alice()
        answer: Deferred = Deferred()

        async def ask(account_id, trapos_id, capabilities, message_id, payload, emit, session=None):
            emit({"type": "permission", "id": "per_1", "tool": "run_command", "detail": "rm x"})
            return await answer

        self.gateway.asks.ask = ask
        operator.send({"id": "a", "traposId": "7:si", "type": "ask", "payload": {"prompt": "hi"}})
        self.assertEqual((await operator.next_message())["payload"]["type"], "permission")
        bob = await connect_operator(self, self.gateway.port, "token-bob")
        asked = [
            ("ask", {"prompt": "hi"}),
            ("ask_cancel", {"ask": "a"}),
            ("ask_permission", {"permissionId": "per_1", "response": "once"}),
            ("ask_answer", {"questionId": "que_1", "answers": [["a"]]}),
            ("file_write", {"path": "/x", "content": ""}),
        ]
        for n, (kind, payload) in enumerate(asked):
            for account in (None, "alice"):
                message = {"id": n, "traposId": "7:si", "type": kind, "payload": payload}
                if account:
                    message["account"] = account
                bob.send(message)
                answer_to_bob = await bob.next_message()
                self.assertEqual(
                    (answer_to_bob["status"], answer_to_bob["error"]["code"]),
                    (404, "not_connected"),
                    (kind, account),
                )
        bob.send({"id": "w", "traposId": "7:si", "type": "watch_activity", "account": "alice"})
        bob.send({"id": "p", "traposId": "9:", "type": "ping"})
        self.assertEqual((await bob.next_message())["id"], "p")  # the watch saw nothing
        answer.callback({"sessionId": "s", "text": ""})
        self.assertEqual((await operator.next_message())["status"], 200)
        self.assertEqual(bob.messages.pending, [])


class FileCallsTests(ConsoleCallsCase):
    async def answer_writes(self, computer, count):
        """Answer ``count`` write_file parts as the computer; their payloads."""
        payloads = []
        for _ in range(count):
            request = await computer.next_message()
            self.assertEqual(request["type"], "write_file")
            payloads.append(request["payload"])
            part = request["payload"]["part"]
            computer.respond(request, payload={"bytesWritten": 1, "sizeBytes": part["size"]})
        return payloads

    async def test_a_write_in_parts_is_one_entry_by_the_operator(self):
        computer, operator = await self.alice()
        watcher = await self.watcher()
        data = bytes(range(256)) * 600  # 150 KiB: three parts
        operator.send(
            {"id": 1, "traposId": "7:si", "type": "file_write",
             "payload": {"path": "/big.bin", "content": base64.b64encode(data).decode()}}
        )  # fmt: skip
        parts = await self.answer_writes(computer, 3)
        self.assertEqual(b"".join(base64.b64decode(p["content"]) for p in parts), data)
        self.assertEqual([p["part"]["final"] for p in parts], [False, False, True])
        # Its progress, after each part the computer wrote (the page's progress bar).
        progress = [await operator.next_message() for _ in parts]
        self.assertEqual(
            [(m["id"], m.get("partial"), m["payload"]) for m in progress],
            [(1, True, {"written": n, "size": len(data)}) for n in (65536, 131072, len(data))],
        )
        answer = await operator.next_message()
        self.assertEqual(answer["payload"], {"bytesWritten": len(data), "sizeBytes": len(data)})
        started, ended = await self.entry(watcher), await self.entry(watcher)
        self.assertEqual(
            {k: started[k] for k in ("type", "detail", "by", "account", "state")},
            {
                "type": "write_file",
                "detail": "/big.bin",
                "by": "operator",
                "account": "alice",
                "state": "started",
            },  # fmt: skip
        )
        self.assertEqual((ended["n"], ended["state"]), (started["n"], "ok"))
        # Nothing else was shown: the parts were quiet.
        watcher.send({"id": "p", "traposId": "9:", "type": "ping"})
        self.assertEqual((await watcher.next_message())["id"], "p")

    async def listed(self, computer, path, entries):
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("list_files", path))
        computer.respond(request, payload={"path": path, "entries": entries})

    async def test_a_rename_of_a_folder_is_one_entry(self):
        computer, operator = await self.alice()
        watcher = await self.watcher()
        operator.send({"id": 1, "traposId": "7:si", "type": "file_move",
                       "payload": {"from": "/lib", "to": "/src"}})  # fmt: skip
        # Is /src free? What is /lib, and what is in it?
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/src"))
        missing = {"code": "fs_error", "message": "/src: No such file"}
        computer.respond(request, ok=False, error=missing)
        folder = {"name": "lib", "type": "dir", "size": 0, "readOnly": False}
        await self.listed(computer, "/", [folder])
        a = {"name": "a.lua", "type": "file", "size": 2, "readOnly": False}
        await self.listed(computer, "/lib", [a, {**folder, "name": "empty"}])
        await self.listed(computer, "/lib/empty", [])
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/lib/a.lua"))
        content = base64.b64encode(b"hi").decode()
        got = {"content": content, "encoding": "base64", "sizeBytes": 2, "offset": 0}
        computer.respond(request, payload={**got, "bytesRead": 2})
        (written,) = await self.answer_writes(computer, 1)
        self.assertEqual((written["path"], written["content"]), ("/src/a.lua", content))
        # The empty folder is made anew (it is not there; a placeholder written and deleted).
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/src/empty"))
        computer.respond(
            request, ok=False, error={**missing, "message": "/src/empty: No such file"}
        )
        (placeholder,) = await self.answer_writes(computer, 1)
        self.assertEqual(placeholder["path"], "/src/empty/.folder")
        request = await computer.next_message()
        self.assertEqual(request["type"], "delete_file")
        computer.respond(request, payload={"deleted": True})
        # What was copied goes once it is seen unchanged; then /lib, once nothing is in it.
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/lib/a.lua"))
        computer.respond(request, payload={**got, "bytesRead": 2})
        request = await computer.next_message()
        self.assertEqual(
            (request["type"], request["payload"]["path"]), ("delete_file", "/lib/a.lua")
        )
        computer.respond(request, payload={"deleted": True})
        await self.listed(computer, "/", [folder])
        await self.listed(computer, "/lib", [{**folder, "name": "empty"}])
        await self.listed(computer, "/lib/empty", [])
        request = await computer.next_message()
        self.assertEqual(
            (request["type"], request["payload"]["path"]), ("delete_file", "/lib/empty")
        )
        computer.respond(request, payload={"deleted": True})
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("delete_file", "/lib"))
        computer.respond(request, payload={"deleted": True})
        answer = await operator.next_message()
        self.assertEqual(answer["payload"], {"moved": ["/src/a.lua"]})
        started, ended = await self.entry(watcher), await self.entry(watcher)
        self.assertEqual(
            (started["type"], started["detail"], ended["state"]),
            ("move_file", "/lib \u2192 /src", "ok"),
        )

    async def test_a_read_only_folder_is_not_moved(self):
        computer, operator = await self.alice()
        operator.send({"id": 1, "traposId": "7:si", "type": "file_move",
                       "payload": {"from": "/rom", "to": "/mine"}})  # fmt: skip
        answer = await operator.next_message()
        self.assertEqual((answer["status"], answer["error"]["code"]), (422, "fs_error"))
        self.assertIn("/rom is read-only", answer["error"]["message"])
        self.assertEqual(computer.messages.pending, [])  # nothing was read or written

    async def test_bad_file_input_is_a_clear_400_and_consent_still_holds(self):
        computer, operator = await self.alice(capabilities=("fs.read",))
        cases = [
            ("file_write", {"path": "/a", "content": "%%%"}, "not valid base64"),
            ("file_write", {"content": ""}, "path must be a path"),
            ("file_move", {"from": "/a", "to": "/a/b"}, "must not be from itself"),
            ("folder_make", {"path": ""}, "path is the root folder, which cannot be changed"),
        ]
        for n, (kind, payload, said) in enumerate(cases):
            operator.send({"id": n, "traposId": "7:si", "type": kind, "payload": payload})
            answer = await operator.next_message()
            self.assertEqual((answer["id"], answer["status"]), (n, 400), answer)
            self.assertIn(said, answer["error"]["message"])
        # No fs.write: refused by the gateway before anything reaches the computer.
        operator.send({"id": "w", "traposId": "7:si", "type": "file_write",
                       "payload": {"path": "/a", "content": ""}})  # fmt: skip
        answer = await operator.next_message()
        self.assertEqual((answer["status"], answer["error"]["code"]), (403, "forbidden"))
        self.assertEqual(computer.messages.pending, [])


class OneStepFileCallsTests(ConsoleCallsCase):
    """Issue 43: a client announcing move_file and make_folder does each in one step."""

    async def test_a_move_is_one_request_with_canonical_paths(self):
        computer, operator = await self.alice(features=["write_id", "move_file", "make_folder"])
        operator.send({"id": 1, "traposId": "7:si", "type": "file_move",
                       "payload": {"from": "lib/", "to": "/x/../src"}})  # fmt: skip
        request = await computer.next_message()
        self.assertEqual(
            (request["type"], request["payload"]), ("move_file", {"from": "/lib", "to": "/src"})
        )
        computer.respond(request, payload={"moved": True, "from": "/lib", "to": "/src"})
        answer = await operator.next_message()
        self.assertEqual(answer["payload"], {"moved": ["/src"]})
        self.assertEqual(computer.messages.pending, [])

    async def test_a_move_into_itself_however_spelt_is_refused_before_anything_is_sent(self):
        computer, operator = await self.alice(features=["move_file"])
        spellings = ["/other/../proj/inner", "proj/./x", "\\proj\\y", "/PROJ/z", "/proj"]
        for n, to in enumerate(spellings):
            operator.send({"id": n, "traposId": "7:si", "type": "file_move",
                           "payload": {"from": "/proj", "to": to}})  # fmt: skip
            answer = await operator.next_message()
            self.assertEqual((answer["id"], answer["status"]), (n, 400), answer)
        self.assertEqual(computer.messages.pending, [])

    async def test_making_a_folder_that_exists_is_one_request_that_deletes_nothing(self):
        computer, operator = await self.alice(features=["make_folder"])
        operator.send({"id": 1, "traposId": "7:si", "type": "folder_make",
                       "payload": {"path": "/proj/"}})  # fmt: skip
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]), ("make_folder", {"path": "/proj"}))
        computer.respond(request, payload={"made": "/proj", "existed": True})
        answer = await operator.next_message()
        self.assertEqual(answer["payload"], {"made": "/proj", "existed": True})
        self.assertEqual(computer.messages.pending, [])

    async def test_an_older_clients_folder_that_exists_is_left_as_it_is(self):
        computer, operator = await self.alice()  # no features: composed
        operator.send({"id": 1, "traposId": "7:si", "type": "folder_make",
                       "payload": {"path": "/proj"}})  # fmt: skip
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/proj"))
        computer.respond(
            request, ok=False, error={"code": "fs_error", "message": "/proj: Is a directory"}
        )
        answer = await operator.next_message()
        self.assertEqual(answer["payload"], {"made": "/proj", "existed": True})
        self.assertEqual(computer.messages.pending, [])  # nothing written, nothing deleted

    async def test_an_older_clients_move_keeps_a_file_saved_while_it_was_copied(self):
        computer, operator = await self.alice()  # no features: composed
        operator.send({"id": 1, "traposId": "7:si", "type": "file_move",
                       "payload": {"from": "/a.lua", "to": "/b.lua"}})  # fmt: skip
        request = await computer.next_message()  # is /b.lua free?
        computer.respond(
            request, ok=False, error={"code": "fs_error", "message": "/b.lua: No such file"}
        )
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("list_files", "/"))
        entry = {"name": "a.lua", "type": "file", "size": 3, "readOnly": False}
        computer.respond(request, payload={"path": "/", "entries": [entry]})

        def read(text):
            return {"content": base64.b64encode(text).decode(), "encoding": "base64",
                    "sizeBytes": len(text), "offset": 0, "bytesRead": len(text)}  # fmt: skip

        request = await computer.next_message()
        computer.respond(request, payload=read(b"old"))
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("write_file", "/b.lua"))
        computer.respond(request, payload={"bytesWritten": 3, "sizeBytes": 3})
        # The player saved /a.lua meanwhile: it is not deleted.
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]["path"]), ("read_file", "/a.lua"))
        computer.respond(request, payload=read(b"new!"))
        answer = await operator.next_message()
        self.assertEqual(answer["error"]["code"], "fs_error", answer)
        self.assertIn("/a.lua changed while it was moved", answer["error"]["message"])
        self.assertEqual(computer.messages.pending, [])  # no delete_file


both_modes(globals(), "AgentCallsTests", "FileCallsTests", "OneStepFileCallsTests")
