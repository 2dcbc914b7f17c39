"""
A tool's arguments are checked (SPEC §10, ``mcp.arguments``): a bad one is an
``isError`` result whose text says what to send.
"""

from tests.unit.mcp.helpers import McpTestCase
from trapsandbox import limits


class ArgumentTests(McpTestCase):
    def test_bad_arguments_are_error_results_the_model_can_fix(self):
        self.computer()
        for tool, arguments, words in (
            ("run_lua", {}, "code is required"),
            ("run_lua", {"code": 5}, "code is required"),
            ("run_command", {"command": "ls", "args": "x"}, "args must be a list"),
            ("run_command", {"command": "ls", "timeoutSeconds": -1}, "timeoutSeconds"),
            ("read_file", {"path": ""}, "path is required"),
            ("write_file", {"path": "/a"}, "content is required"),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], tool)
            self.assertIn(words, self.text(result))
        big = "a" * (limits.MAX_FILE_BYTES + 1)
        self.assertIn("at most", self.text(self.call("write_file", path="/a", content=big)))
