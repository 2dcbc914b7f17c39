"""
The tools as ``tools/list`` shows them (SPEC §10, ``mcp.schemas``).
"""

from tests.unit.mcp.helpers import TOOLS, McpTestCase


class SchemaTests(McpTestCase):
    def test_tools_list_has_the_eight_tools_with_schemas(self):
        tools = self.result("tools/list")["tools"]
        self.assertEqual(tuple(tool["name"] for tool in tools), TOOLS)
        for tool in tools:
            self.assertEqual(tool["inputSchema"]["type"], "object")
            self.assertGreater(len(tool["description"]), 80, tool["name"])
            if tool["name"] != "list_computers":
                self.assertIn("computer", tool["inputSchema"]["properties"])
                self.assertIn("sandbox allow", tool["description"])
                described = tool["inputSchema"]["properties"]["computer"]["description"]
                for form in ('"7:base"', '"7"', '"base"', "Omit it"):
                    self.assertIn(form, described)
            if "path" in tool["inputSchema"]["properties"]:
                self.assertIn("/rom is the read-only", tool["description"])
                self.assertIn("1 MB", tool["description"])
        self.assertEqual(
            self.result("tools/list", {"cursor": "x"})["tools"], tools
        )  # one page, always
