"""
The computer as a sandbox, gateway side, in memory: partial responses, consent,
cancelling, chunked files, and the §9 HTTP endpoints (NDJSON for /execute).
"""

import base64
from urllib.parse import quote

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.callers import asking
from tests.harness.fakes import FakeLink, HeldComputer, PausedComputer, SandboxComputer
from tests.harness.support import JSON, response_frame
from trapsandbox import limits
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError

BASE = "http://127.0.0.1:4444"


def computer_response(request, payload=None, partial=False, **fields):
    if partial:
        fields["partial"] = True
    frame = response_frame(request["traposReceiverId"], request, payload=payload, **fields)
    return wire.decode(orjson.dumps(frame))


class SandboxTestCase(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        self.sandbox = Sandbox(self.registry)

    def computer(self, trapos_id="7:base", **kwargs):
        return SandboxComputer.connect(self.registry, trapos_id, **kwargs)

    def assertGatewayError(self, d, code):
        failure = self.failureResultOf(d, GatewayError)
        self.assertEqual(failure.value.code, code, failure.value.message)
        return failure.value


class PartialTests(SandboxTestCase):
    def setUp(self):
        super().setUp()
        self.link = FakeLink()
        self.session = Session("local", "7:", self.link, self.clock, capabilities={"exec"})
        self.registry.add(self.session)

    def test_partials_reach_the_listener_in_order_and_the_final_ends_it(self):
        heard = []
        d = self.registry.request(asking("7:"), "exec", {"command": "ls"}, on_partial=heard.append)
        [sent] = self.link.sent
        for i in range(5):
            self.assertTrue(self.session.resolve(computer_response(sent, {"n": i}, partial=True)))
        self.assertNoResult(d)
        self.assertEqual(heard, [{"n": i} for i in range(5)])
        self.session.resolve(computer_response(sent, {"exitCode": 0}))
        self.assertEqual(self.successResultOf(d).payload, {"exitCode": 0})
        # Late partials and finals for a finished request are ignored.
        self.assertFalse(self.session.resolve(computer_response(sent, {"n": 9}, partial=True)))
        self.assertFalse(self.session.resolve(computer_response(sent, {"exitCode": 1})))
        self.assertEqual(len(heard), 5)
        self.assertEqual(self.session.in_flight, 0)

    def test_a_partial_does_not_resolve_a_request_without_a_listener(self):
        d = self.registry.request(asking("7:"), "exec", {})
        [sent] = self.link.sent
        self.assertTrue(self.session.resolve(computer_response(sent, {"n": 1}, partial=True)))
        self.assertNoResult(d)

    def test_a_failing_listener_does_not_lose_the_request(self):
        def listener(payload):
            raise RuntimeError("bug in a listener")

        d = self.registry.request(asking("7:"), "exec", {}, on_partial=listener)
        [sent] = self.link.sent
        self.session.resolve(computer_response(sent, {"n": 1}, partial=True))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.session.resolve(computer_response(sent, {"exitCode": 0}))
        self.assertTrue(self.successResultOf(d).ok)

    def test_a_wire_partial_is_decoded(self):
        frame = wire.decode(
            b'{"event":"computer_response","traposSenderId":"7:","messageId":"m","type":"exec",'
            b'"ok":true,"partial":true,"payload":{"type":"stdout_delta","data":"hi"}}'
        )
        self.assertIs(frame.partial, True)
        bad = wire.decode(
            b'{"event":"computer_response","traposSenderId":"7:","messageId":"m","type":"exec",'
            b'"ok":true,"partial":"yes"}'
        )
        self.assertIsInstance(bad, wire.Invalid)


class ConsentTests(SandboxTestCase):
    def test_a_request_outside_the_capabilities_is_refused_without_a_frame(self):
        link = FakeLink()
        self.registry.add(Session("local", "7:base", link, self.clock, capabilities={"screen"}))
        for kind, capability in wire.CAPABILITY_OF.items():
            if capability == "screen":
                continue
            # (Paths a file request names are checked first, by the one rule: good ones here.)
            payload = {"path": "/x", "from": "/x", "to": "/y", "files": [{"path": "/x", "size": 0}]}
            error = self.assertGatewayError(
                self.registry.request(asking("7:base"), kind, payload), "forbidden"
            )
            self.assertIn(f'run "sandbox allow {capability}"', error.message)
            self.assertIn("7:base", error.message)
        self.assertEqual(link.sent, [])
        # ping, cancel and what the owner allowed still go out.
        for kind in ("ping", "cancel", "screen"):
            self.registry.request(asking("7:base"), kind, {})
        self.assertEqual([frame["type"] for frame in link.sent], ["ping", "cancel", "screen"])

    def test_capabilities_read_from_lists_and_empty_objects(self):
        self.assertEqual(wire.decode_capabilities({}), frozenset())
        self.assertEqual(wire.decode_capabilities(["exec", "teleport"]), {"exec"})
        with self.assertRaises(TypeError):
            wire.decode_capabilities("exec")


class CancelTests(SandboxTestCase):
    def test_cancelling_a_run_tells_the_computer(self):
        computer = self.computer()
        d = self.sandbox.execute(asking("7:base"), "sleep", ["30"])
        [run] = computer.runs
        d.cancel()
        self.failureResultOf(d, CancelledError)
        cancel = computer.sent[-1]
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": run["messageId"]})
        )
        self.assertEqual(computer.runs, [])
        self.assertEqual(self.registry.pending, 0)

    def test_a_run_that_times_out_is_cancelled_on_the_computer(self):
        computer = self.computer()
        d = self.sandbox.execute(asking("7:base"), "sleep", timeout_ms=1000)
        self.clock.advance(1 + limits.RUN_ANSWER_MARGIN)
        self.assertGatewayError(d, "timeout")
        self.assertEqual(computer.sent[-1]["type"], "cancel")

    def test_cancelling_a_screen_watch_tells_the_computer(self):
        link = FakeLink()
        self.registry.add(Session("local", "7:", link, self.clock, capabilities={"screen"}))
        d = self.registry.request(asking("7:"), "screen_watch", {})
        d.cancel()
        self.failureResultOf(d, CancelledError)
        watch, cancel = link.sent
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": watch["messageId"]})
        )

    def test_input_is_a_capability_of_its_own(self):
        self.assertEqual(wire.decode_capabilities(["input", "screen"]), {"input", "screen"})
        link = FakeLink()
        self.registry.add(Session("local", "7:", link, self.clock, capabilities={"screen"}))
        self.assertGatewayError(
            self.registry.request(asking("7:"), "input", {"events": []}), "forbidden"
        )
        self.registry.request(asking("7:"), "screen_watch", {})
        self.assertEqual([frame["type"] for frame in link.sent], ["screen_watch"])

    def test_cancelling_other_requests_sends_nothing(self):
        link = FakeLink()
        self.registry.add(Session("local", "7:", link, self.clock))
        d = self.registry.request(asking("7:"), "ping", {})
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual([frame["type"] for frame in link.sent], ["ping"])

    def test_execute_payload_and_its_own_timeout(self):
        computer = self.computer()
        self.sandbox.execute(asking("7:base"), "ls", ["/rom"], cwd="/", max_output_bytes=10)
        [run] = computer.runs
        self.assertEqual(
            run["payload"],
            {
                "command": "ls",
                "args": ["/rom"],
                "cwd": "/",
                "timeoutMs": limits.DEFAULT_RUN_TIMEOUT_MS,
                "maxOutputBytes": 10,
            },
        )


class FileTests(SandboxTestCase):
    @settings(max_examples=80)
    @given(
        binary=st.booleans(),
        size=st.integers(0, 3 * limits.BINARY_PART_BYTES + 7),
        offset=st.integers(0, 3 * limits.BINARY_PART_BYTES + 9),
        length=st.one_of(st.none(), st.integers(1, 3 * limits.BINARY_PART_BYTES)),
    )
    def test_chunked_write_and_read_back(self, binary, size, offset, length):
        features = [wire.BINARY_PARTS] if binary else []
        computer = self.computer(f"{size}:", features=features)
        content = bytes((i * 7 + size) % 256 for i in range(size))
        written = self.successResultOf(
            self.sandbox.write_file(asking(f"{size}:"), "f.bin", content)
        )
        self.assertEqual(written, {"bytesWritten": size, "sizeBytes": size})
        self.assertEqual(computer.files["f.bin"], content)
        parts = [f for f in computer.sent if f["type"] == "write_file"]
        part = limits.BINARY_PART_BYTES if binary else limits.FILE_CHUNK_BYTES
        self.assertEqual(len(parts), max(1, -(-size // part)))
        self.assertEqual([p["payload"]["part"]["final"] for p in parts][-1], True)
        self.assertEqual(["raw" in p for p in parts], [binary] * len(parts))
        for frame in computer.sent:
            if "raw" not in frame:  # (the fake checks a binary part's size itself)
                self.assertLessEqual(len(orjson.dumps(frame)), limits.MAX_OUTBOUND_BYTES)
        read = self.successResultOf(
            self.sandbox.read_file(asking(f"{size}:"), "f.bin", offset, length)
        )
        end = size if length is None else offset + length
        self.assertEqual(read["content"], content[offset:end])
        self.assertEqual((read["sizeBytes"], read["offset"]), (size, offset))
        self.assertEqual(read["bytesRead"], len(content[offset:end]))
        self.registry.remove(computer.session)

    def test_parts_go_a_window_at_a_time_and_the_last_once_the_others_are_written(self):
        computer = HeldComputer.connect(self.registry, features=[wire.BINARY_PARTS])
        content = bytes(range(256)) * 4096  # 1 MiB: 9 parts of at most 120 KiB
        d = self.sandbox.write_file(asking("7:base"), "big.bin", content)
        offsets = []
        while computer.held:
            in_flight = [p["part"]["offset"] for _, p in computer.held]
            self.assertLessEqual(len(in_flight), limits.FILE_WINDOW)
            offsets.extend(o for o in in_flight if o not in offsets)
            if any(p["part"]["final"] for _, p in computer.held):
                self.assertEqual(len(computer.held), 1, "the last part goes alone")
            computer.answer_next()
        self.assertEqual(offsets, list(range(0, len(content), limits.BINARY_PART_BYTES)))
        self.assertEqual(self.successResultOf(d)["bytesWritten"], len(content))
        self.assertEqual(computer.files["big.bin"], content)
        read = self.sandbox.read_file(asking("7:base"), "big.bin")
        most = 0
        while computer.held:
            most = max(most, len(computer.held))
            computer.answer_next()
        self.assertEqual(most, limits.FILE_WINDOW)
        self.assertEqual(self.successResultOf(read)["content"], content)

    def test_two_large_writes_to_one_computer_at_once_are_both_written_whole(self):
        # Its transport paused, all they send waits in the connection's 1 MiB queue: their
        # windows (six parts each) would pass it, so they share one budget per computer.
        computer = PausedComputer.connect(
            self.registry, clock=self.clock, features=[wire.BINARY_PARTS]
        )
        contents = {"a.bin": b"a" * limits.MAX_FILE_BYTES, "b.bin": bytes(range(256)) * 4096}
        writes = {
            path: self.sandbox.write_file(asking("7:base"), path, content)
            for path, content in contents.items()
        }
        rounds = 0
        while any(not d.called for d in writes.values()):
            self.assertLess(computer.outbound.queued_bytes, limits.MAX_QUEUED_BYTES)
            computer.read()
            while computer.held:
                computer.answer_next()
            rounds += 1
            self.assertLess(rounds, 50)
        for path, content in contents.items():
            written = self.successResultOf(writes[path])
            self.assertEqual(written["bytesWritten"], len(content))
            self.assertEqual(computer.files[path], content)

    def test_a_part_waiting_for_room_when_one_before_it_failed_is_never_sent(self):
        computer = HeldComputer.connect(self.registry, features=[wire.BINARY_PARTS])
        first = self.sandbox.write_file(asking("7:base"), "b.bin", b"b" * limits.MAX_FILE_BYTES)
        second = self.sandbox.write_file(asking("7:base"), "a.bin", b"a" * limits.MAX_FILE_BYTES)

        def held(path):
            return [n for n, (_, p) in enumerate(computer.held) if p["path"] == "/" + path]

        self.assertEqual((len(held("b.bin")), held("a.bin")), (limits.FILE_WINDOW, []))
        computer.answer_next()
        computer.answer_next()  # two of the first write's parts: room for two of the second's
        self.assertEqual(len(held("a.bin")), 2)
        request, _ = computer.held.pop(held("a.bin")[1])  # its second part fails first
        computer.fs_error(request, "/a.bin: Out of space")
        while computer.held:
            computer.answer_next()
        sent = [p["part"]["offset"] for p in self.parts(computer) if p["path"] == "/a.bin"]
        self.assertEqual(sent, [0, limits.BINARY_PART_BYTES])
        self.assertGatewayError(second, "fs_error")
        self.assertEqual(self.successResultOf(first)["bytesWritten"], limits.MAX_FILE_BYTES)

    def test_once_a_part_failed_no_more_are_sent(self):
        computer = HeldComputer.connect(self.registry, features=[wire.BINARY_PARTS])
        content = b"z" * (8 * limits.BINARY_PART_BYTES + 1)  # nine parts
        d = self.sandbox.write_file(asking("7:base"), "big.bin", content)
        self.assertEqual(len(computer.held), limits.FILE_WINDOW)
        # The third fails first (refused before the computer saw it, say), then the first
        # is answered: the window has room, but nothing more goes.
        request, _ = computer.held.pop(2)
        computer.fs_error(request, "/big.bin: Out of space")
        computer.answer_next()
        sent = [p["part"]["offset"] for p in self.parts(computer)]
        self.assertEqual(sent, [n * limits.BINARY_PART_BYTES for n in range(limits.FILE_WINDOW)])
        while computer.held:
            computer.answer_next()
        self.assertGatewayError(d, "fs_error")

    def test_a_part_refused_midway_fails_the_write_and_its_last_part_never_goes(self):
        computer = HeldComputer.connect(self.registry)
        content = b"x" * (5 * limits.FILE_CHUNK_BYTES)
        d = self.sandbox.write_file(asking("7:base"), "big.bin", content)
        computer.answer_next()
        request, _ = computer.held.pop(0)
        computer.fs_error(request, "/big.bin: Out of space")
        self.assertGatewayError(d, "fs_error")
        # The parts after it were sent (the computer refuses them: their offsets no longer
        # follow on) and their answers are forgotten; the last one was never sent.
        self.assertEqual([p["part"]["final"] for p in self.parts(computer)], [False] * 4)
        self.assertNotIn("big.bin", computer.files)
        self.assertEqual(self.sandbox.locks.busy(("local", "7:base")), 0)

    def test_a_read_that_fails_midway_forgets_the_parts_after(self):
        computer = HeldComputer.connect(self.registry, features=[wire.BINARY_PARTS])
        computer.files["big.bin"] = b"y" * ((limits.FILE_WINDOW + 2) * limits.BINARY_PART_BYTES)
        d = self.sandbox.read_file(asking("7:base"), "big.bin")
        computer.answer_next()  # the first part: the size
        self.assertEqual(len(computer.held), limits.FILE_WINDOW)
        request, _ = computer.held.pop(0)
        computer.fs_error(request, "/big.bin: No such file")
        self.assertGatewayError(d, "fs_error")
        self.assertEqual(computer.session.in_flight, 0)

    def test_several_whole_files_in_one_message_to_a_client_that_takes_them(self):
        heard = []
        self.registry.file_listeners.append(lambda *changed: heard.append(changed))
        old = self.computer("7:old")
        self.assertEqual(self.sandbox.batch_bytes(asking("7:old")), 0)
        refused = self.sandbox.write_files(asking("7:old"), [("/a", b"a"), ("/b", b"b")])
        self.assertGatewayError(refused, "bad_request")
        self.assertEqual(old.sent, [])
        features = [wire.BINARY_PARTS, wire.WRITE_FILES]
        computer = self.computer("7:new", features=features)
        self.assertEqual(self.sandbox.batch_bytes(asking("7:new")), limits.BINARY_PART_BYTES)
        files = [("a", b"aaa"), ("/x/../b", bytes(range(256)))]
        self.assertEqual(
            self.successResultOf(self.sandbox.write_files(asking("7:new"), files)), ["/a", "/b"]
        )
        (sent,) = computer.sent
        self.assertEqual(
            sent["payload"]["files"], [{"path": "/a", "size": 3}, {"path": "/b", "size": 256}]
        )
        self.assertEqual((computer.files["/a"], computer.files["/b"]), (b"aaa", bytes(range(256))))
        self.assertEqual(heard, [("local", "7:new", "/a"), ("local", "7:new", "/b")])
        # The first that fails: those before it written, and heard of; its failure raised.
        heard.clear()
        files = [("/c", b"c"), ("/rom/d", b"d"), ("/e", b"e")]
        refused = self.sandbox.write_files(asking("7:new"), files)
        self.assertGatewayError(refused, "fs_error")  # (the gateway's own path rule: /rom)
        files = [("/c", b"c"), ("/.settings", b"d")]
        self.assertGatewayError(self.sandbox.write_files(asking("7:new"), files), "forbidden")
        self.assertEqual(len(computer.sent), 1, "neither was sent")
        self.assertEqual(heard, [])

    def test_a_file_refused_by_the_computer_midway_ends_the_batch(self):
        heard = []
        self.registry.file_listeners.append(lambda *changed: heard.append(changed))
        features = [wire.BINARY_PARTS, wire.WRITE_FILES]
        computer = RefusingSecond.connect(self.registry, features=features)
        files = [("/c", b"c"), ("/d", b"d"), ("/e", b"e")]
        error = self.assertGatewayError(
            self.sandbox.write_files(asking("7:base"), files), "fs_error"
        )
        self.assertEqual(error.message, "/rom/x: Access denied")
        self.assertEqual(computer.files.get("/c"), b"c")
        self.assertNotIn("/e", computer.files)
        self.assertEqual(heard, [("local", "7:base", "/c")])

    def test_an_answer_that_does_not_name_the_files_sent_is_an_internal_error(self):
        heard = []
        self.registry.file_listeners.append(lambda *changed: heard.append(changed))
        features = [wire.BINARY_PARTS, wire.WRITE_FILES]
        for written in ([], 5, [{"path": ["/a"]}], [{"path": "/b"}, {"path": "/a"}]):
            computer = Answering.connect(self.registry, "7:odd", features=features)
            computer.written = written
            files = [("/a", b"a"), ("/b", b"b")]
            error = self.assertGatewayError(
                self.sandbox.write_files(asking("7:odd"), files), "internal"
            )
            self.assertIn("does not name the files sent", error.message)
            self.registry.remove(computer.session)
        # Listeners hear what the answer names among the files sent, whatever its shape.
        self.assertEqual(heard, [("local", "7:odd", "/a"), ("local", "7:odd", "/b")])

    def parts(self, computer):
        return [f["payload"] for f in computer.sent if f["type"] == "write_file"]

    def test_a_failing_part_fails_the_write_and_leaves_the_file(self):
        computer = self.computer()
        computer.files["rom/x"] = b"old"
        self.assertGatewayError(
            self.sandbox.write_file(asking("7:base"), "rom/x", b"new"), "fs_error"
        )
        self.assertEqual(computer.files["rom/x"], b"old")

    def test_more_than_a_call_carries_is_refused(self):
        self.computer()
        d = self.sandbox.write_file(asking("7:base"), "big", b"x" * (limits.MAX_FILE_BYTES + 1))
        self.assertGatewayError(d, "too_large")

    def test_a_missing_file_is_an_fs_error(self):
        self.computer()
        error = self.assertGatewayError(
            self.sandbox.read_file(asking("7:base"), "nope"), "fs_error"
        )
        self.assertEqual(error.message, "/nope: No such file")


class Answering(SandboxComputer):
    """A computer whose write_files answer says it wrote ``written``, whatever it was sent."""

    written: object = []

    def on_write_files(self, request, payload):
        self.answer(request, payload={"written": self.written})


class RefusingSecond(SandboxComputer):
    """A computer whose second file of a write_files cannot be written (read-only there)."""

    def on_write_files(self, request, payload):
        payload["files"][1]["path"] = "/rom/x"
        super().on_write_files(request, payload)


class EndpointTests(SandboxTestCase):
    def setUp(self):
        super().setUp()
        app = gateway_app(self.registry)
        self.http = StubTreq(app.resource())

    def post(self, trapos_id, action, body):
        path = f"/computers/{quote(trapos_id, safe='')}/{action}"
        return self.http.post(BASE + path, data=orjson.dumps(body), headers=JSON)

    def finish(self, d):
        self.http.flush()
        response = self.successResultOf(d)
        return response, self.successResultOf(self.http.content(response))

    def lines(self, content):
        self.assertTrue(content.endswith(b"\n"), content)
        return [orjson.loads(line) for line in content.splitlines()]

    def test_execute_streams_ndjson(self):
        computer = self.computer()
        d = self.post("7:base", "execute", {"command": "hello", "args": ["a b"]})
        self.http.flush()
        [run] = computer.runs
        delta = {"type": "stdout_delta", "data": "one\n"}
        computer.answer(run, payload=delta, partial=True)
        computer.answer(run, payload={"type": "stderr_delta", "data": "oops\n"}, partial=True)
        computer.answer(
            run,
            payload={
                "exitCode": 1,
                "timedOut": False,
                "durationMs": 12,
                # The whole output: what no partial carried yet follows as a last delta.
                "stdout": "one\ntwo\n",
                "stderr": "oops\n",
            },
        )
        response, content = self.finish(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/x-ndjson"])
        self.assertEqual(
            self.lines(content),
            [
                delta,
                {"type": "stderr_delta", "data": "oops\n"},
                {"type": "stdout_delta", "data": "two\n"},
                {"type": "result", "exitCode": 1, "timedOut": False, "durationMs": 12},
            ],
        )

    def test_execute_refused_before_it_starts_is_a_json_answer(self):
        self.computer(capabilities=("screen",))
        response, content = self.finish(self.post("7:base", "execute", {"command": "ls"}))
        self.assertEqual(response.code, 403)
        body = orjson.loads(content)
        self.assertEqual((body["ok"], body["code"]), (False, "forbidden"))
        self.assertIn('run "sandbox allow exec"', body["error"])
        response, content = self.finish(self.post("9:", "execute", {"command": "ls"}))
        self.assertEqual((response.code, orjson.loads(content)["code"]), (404, "not_connected"))

    def test_execute_failing_once_begun_is_an_error_line(self):
        computer = self.computer()
        d = self.post("7:base", "execute", {"command": "ls"})
        self.http.flush()
        self.registry.remove(computer.session)
        response, content = self.finish(d)
        self.assertEqual(response.code, 200)
        [line] = self.lines(content)
        self.assertEqual((line["type"], line["code"]), ("error", "not_connected"))

    def test_bad_bodies(self):
        self.computer()
        for action, body in [
            ("execute", {}),
            ("execute", {"command": "ls", "args": "x"}),
            ("execute", {"command": "ls", "timeoutMs": -1}),
            ("execute", {"command": "ls", "maxOutputBytes": 2**30}),
            ("eval", {"code": 3}),
            ("read-file", {"path": "a", "offset": -1}),
            ("read-file", {"path": "a", "encoding": "utf-8"}),
            ("write-file", {"path": "a", "content": "not base64!"}),
            ("list-files", {}),
        ]:
            response, content = self.finish(self.post("7:base", action, body))
            answer = orjson.loads(content)
            self.assertEqual((response.code, answer["code"]), (400, "bad_request"), body)
            self.assertIsInstance(answer["error"], str)
            self.assertNotIn("e+", answer["error"])  # limits read as numbers, not 1.04858e+06
        response, content = self.finish(
            self.http.post(BASE + "/computers/7%3Abase/eval", data=b"{nope", headers=JSON)
        )
        self.assertEqual(response.code, 400)

    def test_files_over_http(self):
        computer = self.computer()
        content = bytes(range(256)) * 1000
        encoded = base64.b64encode(content).decode()
        response, body = self.finish(
            self.post("7:base", "write-file", {"path": "d/f", "content": encoded})
        )
        self.assertEqual(response.code, 200, body)
        self.assertEqual(
            orjson.loads(body), {"ok": True, "bytesWritten": 256000, "sizeBytes": 256000}
        )
        self.assertEqual(computer.files["d/f"], content)
        response, body = self.finish(self.post("7:base", "read-file", {"path": "d/f"}))
        answer = orjson.loads(body)
        self.assertEqual(base64.b64decode(answer["content"]), content)
        self.assertEqual(
            (answer["ok"], answer["encoding"], answer["sizeBytes"], answer["bytesRead"]),
            (True, "base64", 256000, 256000),
        )
        response, body = self.finish(self.post("7:base", "read-file", {"path": "gone"}))
        self.assertEqual((response.code, orjson.loads(body)["code"]), (422, "fs_error"))
        response, body = self.finish(self.post("7:base", "list-files", {"path": "d"}))
        self.assertEqual(orjson.loads(body)["entries"][0]["size"], 256000)
        response, body = self.finish(self.post("7:base", "delete-file", {"path": "d/f"}))
        self.assertEqual(orjson.loads(body), {"ok": True, "deleted": True})
        response, body = self.finish(self.http.get(BASE + "/computers/7%3Abase/screen"))
        self.assertEqual(orjson.loads(body)["lines"], ["> hi"])

    def test_eval_failure_is_a_200_answer(self):
        computer = self.computer()
        d = self.post("7:base", "eval", {"code": "error('x')"})
        self.http.flush()
        [run] = computer.runs
        answer = {"ok": False, "returns": [], "stdout": "", "error": "x", "durationMs": 1}
        computer.answer(run, payload={**answer, "timedOut": False})
        response, body = self.finish(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(orjson.loads(body)["error"], "x")
