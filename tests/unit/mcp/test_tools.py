"""
The tools over an in-memory §9 computer (SPEC §10, ``mcp.tools``): what each
asks of the computer and how its answer, refusal or failure reads; the
50 s bound.
"""

import base64

from tests.unit.mcp.helpers import McpTestCase
from trapsandbox import limits


class ToolTests(McpTestCase):
    def test_list_computers(self):
        self.assertIn("No computer is connected", self.text(self.call("list_computers")))
        self.computer("7:base")
        self.computer("8:", capabilities=())
        result = self.call("list_computers")
        text = self.text(result)
        self.assertIn("2 computers connected", text)
        self.assertIn('7:base (id 7, label "base"); allowed: eval, exec, fs.read', text)
        self.assertIn(
            '8: (id 8, no label); allowed: nothing (the player can run "sandbox allow', text
        )
        self.assertEqual(
            [c["traposId"] for c in result["structuredContent"]["computers"]], ["7:base", "8:"]
        )
        self.assertEqual(result["structuredContent"]["computers"][1]["label"], None)

    def test_run_lua(self):
        c = self.computer()
        d = self.call_async("run_lua", code="return 6*7")
        [run] = c.runs
        self.assertEqual(run["payload"], {"code": "return 6*7", "timeoutMs": 30000})
        answer = {
            "ok": True,
            "returns": ["42"],
            "stdout": "hi\n",
            "durationMs": 3,
            "timedOut": False,
        }
        c.answer(run, payload=answer)
        result = self.done(d)
        self.assertNotIn("isError", result)
        self.assertIn("Returned: 42", self.text(result))
        self.assertIn("hi", self.text(result))
        self.assertEqual(result["structuredContent"], answer)

    def test_run_lua_error_is_an_error_result(self):
        c = self.computer()
        d = self.call_async("run_lua", code="error('boom')")
        c.answer(
            c.runs[0],
            payload={
                "ok": False,
                "returns": [],
                "stdout": "",
                "error": "boom",
                "durationMs": 1,
                "timedOut": False,
            },
        )
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("failed on 7:base: boom", self.text(result))

    def test_run_command(self):
        c = self.computer()
        d = self.call_async("run_command", command="ls", args=["/"], timeoutSeconds=5)
        [run] = c.runs
        self.assertEqual(run["payload"], {"command": "ls", "args": ["/"], "timeoutMs": 5000})
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": "rom\n"})
        c.answer(
            run,
            payload={
                "exitCode": 0,
                "timedOut": False,
                "durationMs": 9,
                "stdout": "rom\n",
                "stderr": "oops",
            },
        )
        text = self.text(self.done(d))
        self.assertIn("ls on 7:base: exit code 0", text)
        self.assertIn("--- stdout ---\nrom", text)
        self.assertIn("--- stderr ---\noops", text)

    def test_a_long_timeout_is_kept_within_the_call(self):
        c = self.computer()
        self.call_async("run_command", command="sleep", timeoutSeconds=600)
        self.assertEqual(c.runs[0]["payload"]["timeoutMs"], limits.MCP_MAX_RUN_SECONDS * 1000)

    def test_a_run_that_times_out_on_the_computer_gives_its_output(self):
        c = self.computer()
        d = self.call_async("run_command", command="forever", timeoutSeconds=2)
        c.answer(
            c.runs[0],
            payload={
                "exitCode": 1,
                "timedOut": True,
                "durationMs": 2000,
                "stdout": "tick\ntick\n",
                "stderr": "",
            },
        )
        text = self.text(self.done(d))
        self.assertIn("stopped after 2 s (timed out)", text)
        self.assertIn("tick\ntick", text)

    def test_the_call_is_bounded_and_the_run_cancelled(self):
        c = self.computer()
        d = self.call_async("run_command", command="stuck", timeoutSeconds=45)
        [run] = c.runs
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": "so far"})
        self.clock.advance(limits.MCP_CALL_TIMEOUT - 0.1)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(0.2)
        result = self.done(d)
        self.assertIn("so far", self.text(result))
        self.assertIn("timed out", self.text(result))
        self.assertTrue(result["structuredContent"]["timedOut"])
        cancels = [frame for frame in c.sent if frame["type"] == "cancel"]
        self.assertEqual([f["payload"]["messageId"] for f in cancels], [run["messageId"]])

    def test_a_silent_stuck_call_is_a_timeout_error(self):
        c = self.computer()
        d = self.call_async("run_lua", code="while true do end", timeoutSeconds=45)
        self.clock.advance(limits.MCP_CALL_TIMEOUT + 1)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("did not finish within 50 s", self.text(result))
        self.assertIn("cancelled", self.text(result))
        self.assertEqual([f["type"] for f in c.sent], ["eval", "cancel"])
        # A shorter run's own deadline (its timeout and the answer margin) comes first.
        d = self.call_async("run_lua", code="while true do end")
        self.clock.advance(limits.DEFAULT_RUN_TIMEOUT_MS / 1000 + limits.RUN_ANSWER_MARGIN)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("timeout: no answer from the computer within 40 s", self.text(result))

    def test_files(self):
        c = self.computer()
        result = self.call("write_file", computer="base", path="/notes/a.txt", content="héllo")
        self.assertIn("Wrote 6 bytes to /notes/a.txt on 7:base", self.text(result))
        self.assertEqual(c.files["/notes/a.txt"], "héllo".encode())
        result = self.call("read_file", path="/notes/a.txt")
        self.assertIn("6 bytes, UTF-8 text:\nhéllo", self.text(result))
        self.assertEqual(result["structuredContent"]["encoding"], "utf-8")
        self.assertEqual(result["structuredContent"]["content"], "héllo")
        c.files["/bin"] = b"\xff\x00\x01"
        result = self.call("read_file", path="/bin")
        self.assertIn(
            "not UTF-8, so in base64:\n" + base64.b64encode(b"\xff\x00\x01").decode(),
            self.text(result),
        )
        self.assertEqual(result["structuredContent"]["encoding"], "base64")
        self.assertIn("/notes/a.txt  6 bytes", self.text(self.call("list_files", path="/")))
        self.assertIn("Deleted /bin", self.text(self.call("delete_file", path="/bin")))
        self.assertIn("does not exist", self.text(self.call("delete_file", path="/bin")))
        result = self.call("write_file", path="/empty", content="")
        self.assertEqual(c.files["/empty"], b"")

    def test_a_big_file_is_read_in_chunks(self):
        c = self.computer()
        c.files["/big"] = b"a" * 200_000
        result = self.call("read_file", path="/big")
        self.assertEqual(len(result["structuredContent"]["content"]), 200_000)
        self.assertEqual(len([f for f in c.sent if f["type"] == "read_file"]), 4)

    def test_read_screen(self):
        self.computer()
        text = self.text(self.call("read_screen"))
        self.assertIn("(51x19, cursor at column 1, line 2):\n> hi", text)

    def test_forbidden_says_how_to_allow_it(self):
        c = self.computer(capabilities=())
        for tool, arguments, capability in (
            ("run_lua", {"code": "return 1"}, "eval"),
            ("run_command", {"command": "ls"}, "exec"),
            ("read_file", {"path": "/a"}, "fs.read"),
            ("list_files", {"path": "/"}, "fs.read"),
            ("write_file", {"path": "/a", "content": ""}, "fs.write"),
            ("delete_file", {"path": "/a"}, "fs.write"),
            ("read_screen", {}, "screen"),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], tool)
            self.assertIn(f'run "sandbox allow {capability}"', self.text(result))
            self.assertIn("Only the player at 7:base can allow it", self.text(result))
            self.assertEqual(result["structuredContent"]["code"], "forbidden")
        self.assertEqual(c.sent, [])

    def test_the_settings_file_is_refused_without_asking_for_a_permission(self):
        c = self.computer()
        c.files["/.settings"] = b"secret"
        result = self.call("read_file", path="/.settings")
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "forbidden")
        self.assertIn("holds its sandbox password", self.text(result))
        self.assertNotIn("allow", self.text(result))
        self.assertNotIn("secret", self.text(result))
        self.assertEqual(c.sent, [])

    def test_fs_error_says_what_paths_are(self):
        self.computer()
        result = self.call("write_file", path="/rom/x", content="no")
        self.assertTrue(result["isError"])
        self.assertIn("fs_error: /rom/x: Access denied", self.text(result))
        self.assertIn("/rom is read-only", self.text(result))
        result = self.call("read_file", path="/missing")
        self.assertIn("No such file", self.text(result))

    def test_not_connected_mid_call(self):
        c = self.computer()
        d = self.call_async("run_lua", code="sleep(5)")
        self.registry.remove(c.session)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("not_connected", self.text(result))
        self.assertIn("list_computers", self.text(result))
