"""The snapshot routes (SPEC §15) through a real port: two accounts, fake computers that
answer ``snapshot_list``, ``read_file``, ``write_file`` and ``delete_file`` from a dict."""

import base64
from urllib.parse import quote

import orjson
import treq
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.support import (
    JSON,
    accounts_file,
    both_modes,
    bounded,
    connect,
    connect_operator,
    reactor,
    start_gateway,
)
from trapsandbox import config
from trapsandbox.admission import accounts


class FilesComputer:
    """Answers the file requests of one ``TestComputer`` from ``files`` until closed."""

    def __init__(self, computer):
        self.computer = computer
        self.files = {"/a.txt": (b"one\ntwo\n", 1000), "/d/b.bin": (b"\x00\xff" * 50, 1000)}
        self.clock = 1000
        self.requests = []
        self.serve()

    def serve(self):
        d = self.computer.messages.get()
        d.addCallback(self.answer)

    def answer(self, request):
        if request.get("event") != "gateway_request":
            return self.serve()
        kind, payload = request["type"], request.get("payload") or {}
        path = payload.get("path")
        if kind == "snapshot_list":
            files = [{"path": p, "size": len(d), "modified": m} for p, (d, m) in self.files.items()]
            answer = {"files": files, "total": sum(f["size"] for f in files)}
        elif kind == "read_file":
            data = self.files[path][0]
            answer = {
                "content": base64.b64encode(data).decode(),
                "encoding": "base64",
                "sizeBytes": len(data),
                "offset": 0,
                "bytesRead": len(data),
            }
        elif kind == "write_file":
            self.write(path, base64.b64decode(payload["content"]))
            answer = {"bytesWritten": 0, "sizeBytes": len(self.files[path][0])}
        elif kind == "delete_file":
            answer = {"deleted": self.files.pop(path, None) is not None}
        else:
            answer = {}
        self.requests.append(kind)
        self.computer.respond(request, payload=answer)
        self.serve()

    def write(self, path, data):
        self.clock += 1
        self.files[path] = (data, self.clock)


class SnapshotGateway(TestCase):
    """A gateway with accounts alice and bob, and alice's computer ``1:a`` (``start``)."""

    timeout = 30

    async def start(self, capabilities=("fs.read", "fs.write"), **settings):
        path = accounts_file(self, "alice", "bob")
        self.gateway = start_gateway(
            self, accounts_file=path, accounts=accounts.load(path), **settings
        )
        await self.gateway.snapshots.ready()
        self.pool = HTTPConnectionPool(reactor(), persistent=False)
        computer = await connect(self, self.gateway.port)
        await computer.hello("s-alice", "1:a")
        reply = await computer.request("capabilities", {"capabilities": list(capabilities)})
        self.assertTrue(reply["ok"], reply)
        return FilesComputer(computer)

    async def http(self, method, path, token, body=None):
        response = await bounded(
            treq.request(
                method,
                f"http://127.0.0.1:{self.gateway.port}{path}",
                headers={"authorization": f"Bearer token-{token}", **JSON},
                data=None if body is None else body,
                pool=self.pool,
            )
        )
        return response.code, orjson.loads(await bounded(treq.content(response)))


class SnapshotRoutesTests(SnapshotGateway):
    async def test_take_list_changes_restore(self):
        alice = await self.start()
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, body = await self.http("POST", base, "alice", b"{}")
        self.assertEqual((status, body["ok"], body["files"]), (200, True, 2), body)
        snap = body["id"]
        status, body = await self.http("GET", base, "alice")
        self.assertEqual([s["id"] for s in body["snapshots"]], [snap])

        alice.write("/a.txt", b"one\n2\n")
        alice.write("/c.txt", b"new")
        status, body = await self.http("GET", f"{base}/{snap}/changes", "alice")
        self.assertEqual(status, 200, body)
        self.assertEqual([c["path"] for c in body["added"]], ["/c.txt"])
        self.assertEqual([c["path"] for c in body["modified"]], ["/a.txt"])
        self.assertIn("+2", body["diffs"][0]["diff"])

        status, body = await self.http("POST", f"{base}/{snap}/restore", "alice")
        self.assertEqual(status, 200, body)
        self.assertEqual((body["deleted"], body["written"]), (["/c.txt"], ["/a.txt"]))
        self.assertEqual(alice.files["/a.txt"][0], b"one\ntwo\n")
        self.assertNotIn("/c.txt", alice.files)

    async def test_another_accounts_computer_answers_like_a_missing_one(self):
        await self.start()
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, body = await self.http("POST", base, "alice", b"{}")
        snap = body["id"]
        missing = f"/computers/{quote('9:gone', safe='')}/snapshots"
        for method, suffix, body in (
            ("GET", "", None),
            ("POST", "", b"{}"),
            ("GET", f"/{snap}/changes", None),
            ("POST", f"/{snap}/restore", b"{}"),
        ):
            gone = await self.http(method, missing + suffix, "bob", body)
            # Bob's own traposId, and alice's named with ?account= (which reaches nobody's).
            for path in (base + suffix, base + suffix + "?account=alice"):
                theirs = await self.http(method, path, "bob", body)
                self.assertEqual(theirs[0], 404, (method, path, theirs))
                self.assertEqual(
                    (theirs[1]["code"], theirs[1]["error"].replace("1:a", "X")),
                    (gone[1]["code"], gone[1]["error"].replace("9:gone", "X")),
                )

    async def test_a_bad_body_is_a_json_error(self):
        await self.start()
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, body = await self.http("POST", base, "alice", b"[1]")
        self.assertEqual((status, body["ok"], body["code"]), (400, False, "bad_request"))
        status, body = await self.http("GET", f"{base}/nope/changes", "alice")
        self.assertEqual((status, body["code"]), (404, "not_found"))

    async def test_a_small_snapshot_max_mb_refuses_cleanly(self):
        """SANDBOX_SNAPSHOT_MAX_MB reaches the store: 108 bytes of files over a 104-byte
        bound are refused before any file is read, with a 413 naming the setting, and
        nothing is listed."""
        settings = config.load({"SANDBOX_SNAPSHOT_MAX_MB": "0.0001"})
        self.assertEqual(settings.snapshot_max_bytes, 104)
        alice = await self.start(snapshot_max_bytes=settings.snapshot_max_bytes)
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, body = await self.http("POST", base, "alice", b"{}")
        self.assertEqual((status, body["code"]), (413, "too_large"), body)
        self.assertIn("108 bytes", body["error"])
        self.assertIn("at most 104 bytes (SANDBOX_SNAPSHOT_MAX_MB)", body["error"])
        self.assertEqual(alice.requests, ["snapshot_list"])
        status, body = await self.http("GET", base, "alice")
        self.assertEqual((status, body["snapshots"]), (200, []))


class SnapshotActivityTests(SnapshotGateway):
    async def test_each_operation_is_one_entry_of_the_computers_activity(self):
        """
        SPEC §14: a snapshot, a comparison and a restore are each one entry (by whoever asked),
        not the dozens of file requests they make; the file requests around them still show.
        """
        alice = await self.start()
        watcher = await connect_operator(self, self.gateway.port, "token-alice")
        watcher.send({"id": "a", "type": "watch_activity", "traposId": "1:a"})
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, taken = await self.http("POST", base, "alice", b"{}")
        self.assertEqual(status, 200, taken)
        alice.write("/a.txt", b"changed\n")
        status, _ = await self.http("GET", f"{base}/{taken['id']}/changes", "alice")
        self.assertEqual(status, 200)
        status, _ = await self.http("POST", f"{base}/{taken['id']}/restore", "alice", b"{}")
        self.assertEqual(status, 200)
        status, _ = await self.http(
            "POST", "/computers/1%3Aa/delete-file", "alice", b'{"path": "/d/b.bin"}'
        )
        self.assertEqual(status, 200)
        entries = []
        while len(entries) < 8:
            message = await watcher.next_message()
            entry = message["payload"]["activity"]
            entries.append((entry["type"], entry["detail"], entry["state"], entry["by"]))
        snap = taken["id"]
        self.assertEqual(
            entries,
            [
                ("snapshot", "manual", "started", "operator"),
                ("snapshot", "manual", "ok", "operator"),
                ("snapshot_changes", snap, "started", "operator"),
                ("snapshot_changes", snap, "ok", "operator"),
                ("snapshot_restore", snap, "started", "operator"),
                ("snapshot_restore", snap, "ok", "operator"),
                ("delete_file", "/d/b.bin", "started", "operator"),
                ("delete_file", "/d/b.bin", "ok", "operator"),
            ],
        )
        self.assertIn("read_file", alice.requests)  # they were made, and not shown


class SnapshotSocketTests(SnapshotGateway):
    """The same operations as ``/operator`` message types (what the web console uses)."""

    async def operator(self, token):
        return await connect_operator(self, self.gateway.port, f"token-{token}")

    async def ask(self, operator, kind, payload=None, trapos_id="1:a", **extra):
        message = {"id": kind, "traposId": trapos_id, "type": kind, **extra}
        if payload is not None:
            message["payload"] = payload
        operator.send(message)
        answer = await operator.next_message()
        self.assertEqual(answer["id"], kind)
        return answer

    async def test_take_list_changes_restore_answer_as_the_routes_do(self):
        alice = await self.start()
        operator = await self.operator("alice")
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        taken = await self.ask(operator, "snapshot_take")
        self.assertEqual((taken["status"], taken["ok"]), (200, True), taken)
        self.assertEqual(taken["payload"]["files"], 2)
        snap = taken["payload"]["id"]

        listed = await self.ask(operator, "snapshots")
        status, body = await self.http("GET", base, "alice")
        self.assertEqual(
            listed,
            {
                "id": "snapshots",
                "status": status,
                "ok": True,
                "payload": {"snapshots": body["snapshots"]},
            },
        )
        self.assertEqual([(s["id"], s["reason"]) for s in body["snapshots"]], [(snap, "manual")])

        alice.write("/a.txt", b"one\n2\n")
        alice.write("/c.txt", b"new")
        changes = await self.ask(operator, "snapshot_changes", {"snapshot": snap})
        status, body = await self.http("GET", f"{base}/{snap}/changes", "alice")
        self.assertEqual(
            (changes["status"], changes["payload"]),
            (status, {k: v for k, v in body.items() if k != "ok"}),
        )
        self.assertEqual([c["path"] for c in body["modified"]], ["/a.txt"])
        self.assertIn("+2", body["diffs"][0]["diff"])

        restored = await self.ask(operator, "snapshot_restore", {"snapshot": snap})
        self.assertEqual(restored["status"], 200, restored)
        payload = restored["payload"]
        self.assertEqual((payload["deleted"], payload["written"]), (["/c.txt"], ["/a.txt"]))
        self.assertEqual(alice.files["/a.txt"][0], b"one\ntwo\n")
        self.assertNotIn("/c.txt", alice.files)
        # The undo can be undone: the state it replaced is the newest snapshot.
        listed = await self.ask(operator, "snapshots")
        newest = listed["payload"]["snapshots"][0]
        self.assertEqual((newest["id"], newest["reason"]), (payload["before"], "restore"))

    async def test_another_accounts_snapshots_answer_like_a_missing_computers(self):
        alice = await self.start()
        mine = await self.operator("alice")
        snap = (await self.ask(mine, "snapshot_take"))["payload"]["id"]
        alice.write("/a.txt", b"changed")
        before = list(alice.requests)
        bob = await self.operator("bob")
        for kind, payload in (
            ("snapshots", None),
            ("snapshot_take", None),
            ("snapshot_changes", {"snapshot": snap}),
            ("snapshot_restore", {"snapshot": snap}),
        ):
            theirs = await self.ask(bob, kind, payload)
            gone = await self.ask(bob, kind, payload, trapos_id="9:gone")
            self.assertEqual(theirs["status"], 404, (kind, theirs))
            self.assertEqual(
                {**theirs, "error": theirs["error"]["message"].replace("1:a", "X")},
                {**gone, "error": gone["error"]["message"].replace("9:gone", "X")},
            )
            # Bob's ?account=alice is refused the same way.
            asked = await self.ask(bob, kind, payload, account="alice")
            self.assertEqual(asked["status"], 404, (kind, asked))
        # Nothing reached alice's computer, nothing of hers was restored.
        self.assertEqual(alice.requests, before)
        self.assertEqual(alice.files["/a.txt"][0], b"changed")

    async def test_bad_input_gets_a_clear_error_and_the_socket_stays(self):
        await self.start()
        operator = await self.operator("alice")
        for kind, payload in (
            ("snapshot_changes", None),
            ("snapshot_restore", {"snapshot": 7}),
            ("snapshot_restore", {"snapshot": ""}),
        ):
            answer = await self.ask(operator, kind, payload)
            self.assertEqual((answer["status"], answer["error"]["code"]), (400, "bad_request"))
            self.assertIn("payload.snapshot must be a snapshot id", answer["error"]["message"])
        answer = await self.ask(operator, "snapshot_take", [1])
        self.assertEqual(answer["status"], 400, answer)
        self.assertEqual(answer["error"]["message"], "payload must be a JSON object")
        answer = await self.ask(operator, "snapshot_changes", {"snapshot": "nope"})
        self.assertEqual((answer["status"], answer["error"]["code"]), (404, "not_found"))
        self.assertEqual((await self.ask(operator, "snapshots"))["status"], 200)

    async def test_a_restore_without_fs_write_is_refused_before_anything_moves(self):
        """Not a snapshot taken, then a failed write: a 403 saying how to allow it."""
        alice = await self.start(capabilities=("fs.read",))
        operator = await self.operator("alice")
        snap = (await self.ask(operator, "snapshot_take"))["payload"]["id"]
        alice.write("/a.txt", b"changed")
        before = list(alice.requests)
        answer = await self.ask(operator, "snapshot_restore", {"snapshot": snap})
        self.assertEqual((answer["status"], answer["error"]["code"]), (403, "forbidden"), answer)
        self.assertIn('"sandbox allow fs.write"', answer["error"]["message"])
        base = f"/computers/{quote('1:a', safe='')}/snapshots"
        status, body = await self.http("POST", f"{base}/{snap}/restore", "alice", b"{}")
        self.assertEqual((status, body["code"]), (403, "forbidden"), body)
        self.assertEqual(alice.requests, before)
        listed = await self.ask(operator, "snapshots")
        self.assertEqual([s["id"] for s in listed["payload"]["snapshots"]], [snap])

    async def test_the_requests_route_answers_as_the_socket(self):
        """``POST /computers/{id}/requests`` is what the socket answers (its doc says so)."""
        await self.start()
        operator = await self.operator("alice")
        await self.ask(operator, "snapshot_take")
        answer = await self.ask(operator, "snapshots")
        status, body = await self.http(
            "POST",
            f"/computers/{quote('1:a', safe='')}/requests",
            "alice",
            orjson.dumps({"type": "snapshots"}),
        )
        self.assertEqual({"id": "snapshots", "status": status, **body}, answer)


both_modes(globals(), "SnapshotSocketTests")
