"""
The peripheral and turtle tools (SPEC §16) over an in-memory computer: what
each asks of the computer, how its answer and refusals read, the annotations.
"""

from tests.unit.mcp.helpers import McpTestCase

PERIPHERALS = ("peripheral", "turtle")


class PeripheralToolTests(McpTestCase):
    def test_list_peripherals(self):
        c = self.computer(capabilities=PERIPHERALS)
        result = self.call("list_peripherals")
        self.assertIn("Peripherals of 7:base:\n- top (monitor): getSize, write", self.text(result))
        self.assertEqual(result["structuredContent"]["peripherals"][0]["name"], "top")
        self.assertEqual(c.sent[-1]["type"], "list_peripherals")

    def test_call_peripheral(self):
        c = self.computer(capabilities=PERIPHERALS)
        result = self.call("call_peripheral", name="top", method="getSize")
        self.assertIn("top.getSize on 7:base returned: 15, 5", self.text(result))
        self.assertEqual(result["structuredContent"]["returns"], [15, 5])
        self.call("call_peripheral", name="top", method="write", args=["hi", 2])
        self.assertEqual(
            c.sent[-1]["payload"], {"name": "top", "method": "write", "args": ["hi", 2]}
        )

    def test_a_failing_call_is_an_error_with_craftos_message(self):
        self.computer(capabilities=PERIPHERALS)
        result = self.call("call_peripheral", name="top", method="fly")
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "peripheral_error")
        self.assertIn("No such method fly", self.text(result))
        self.assertIn("list_peripherals shows", self.text(result))

    def test_bad_arguments_say_what_to_send(self):
        c = self.computer(capabilities=PERIPHERALS)
        for tool, arguments in (
            ("call_peripheral", {"name": "top"}),
            ("call_peripheral", {"name": "top", "method": "write", "args": "hi"}),
            ("turtle", {}),
            ("turtle", {"action": "forward", "args": {"n": 1}}),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], (tool, arguments))
        self.assertEqual(c.sent, [])

    def test_turtle(self):
        c = self.computer(capabilities=PERIPHERALS)
        result = self.call("turtle", action="forward")
        self.assertIn(
            'turtle.forward on 7:base returned: false, "Out of fuel"; fuel 0, slot 1 selected.',
            self.text(result),
        )
        self.assertEqual(c.sent[-1]["payload"], {"action": "forward", "args": []})

    def test_forbidden_says_how_to_allow_it(self):
        c = self.computer(capabilities=())
        for tool, arguments, capability in (
            ("list_peripherals", {}, "peripheral"),
            ("call_peripheral", {"name": "top", "method": "getSize"}, "peripheral"),
            ("turtle", {"action": "forward"}, "turtle"),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], tool)
            self.assertIn(f'run "sandbox allow {capability}"', self.text(result))
        self.assertEqual(c.sent, [])

    def test_annotations(self):
        tools = {tool["name"]: tool for tool in self.result("tools/list")["tools"]}
        self.assertEqual(tools["list_peripherals"]["annotations"], {"readOnlyHint": True})
        for name in ("call_peripheral", "turtle"):
            self.assertEqual(tools[name]["annotations"], {"destructiveHint": True})

    def test_stopped_by_the_player_says_not_to_retry(self):
        c = self.computer(capabilities=PERIPHERALS)
        message = (
            'the player stopped the sandbox agent on computer 7:base; on it, run "sandbox resume"'
        )

        def stopped(request, payload):
            c.answer(request, ok=False, error={"code": "stopped", "message": message})

        c.on_turtle = stopped
        result = self.call("turtle", action="forward")
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "stopped")
        self.assertIn(message, self.text(result))
        self.assertIn("do not retry", self.text(result))
