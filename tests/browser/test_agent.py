"""
The console's agent panel (issue 34) in a real headless browser
(``tests.browser.browser``), with the real opencode driven by a scripted model
(``tests.harness.fake_model``, as ``tests/lua/test_ask_e2e.py``): an ask typed
in the page runs a tool on the harness computer once the page allows it, the
agent's question is answered in the page, the change is undone from the page,
and the next ask is stopped there; another account's token reaches none of it.

``TRAPSANDBOX_AGENT_SCREENSHOT=docs/console-agent.png`` saves the panel after
the first ask (how ``docs/console-agent.png`` was made; relative to the tree).
"""

import os

from tests.browser.browser import ADMIN_TOKEN, BrowserCase, By, Keys
from tests.harness.fake_model import start_fake_model, tool_messages
from tests.harness.opencode import start_opencode
from tests.harness.support import closed_port
from trapsandbox.ops import ctl

OPENCODE_PASSWORD = "oc-agent-panel"
NOTE = "written by the agent\n"
QUESTION = {
    "questions": [
        {
            "question": "Which colour should the lamp be?",
            "header": "Colour",
            "options": [
                {"label": "red", "description": "warm"},
                {"label": "blue", "description": "cold"},
            ],
        }
    ]
}
SCRIPT = [
    ("trapsandbox_write_file", {"computer": "7:si", "path": "/note.txt", "content": NOTE}),
    ("question", QUESTION),
]
CLOSING = "Blue it is: the note is written."


class AgentPanelTests(BrowserCase):
    timeout = 240

    async def start_with_opencode(self):
        """The gateway and the real opencode, each told where the other is."""
        oc_port = closed_port()
        await self.start(
            OPENCODE_URL=f"http://127.0.0.1:{oc_port}",
            OPENCODE_SERVER_PASSWORD=OPENCODE_PASSWORD,
            SANDBOX_STATE_DIR=os.path.abspath(self.mktemp()),
        )
        self.model = await start_fake_model(self, "", {}, script=SCRIPT, answer=CLOSING)
        config = {
            **self.model.opencode_config(),
            **ctl.opencode_config(self.base, True),
        }
        await start_opencode(
            self,
            OPENCODE_PASSWORD,
            config,
            env={"SANDBOX_ADMIN_TOKEN": ADMIN_TOKEN},
            global_config=True,
            port=oc_port,
        )

    def ask(self, prompt):
        field = self.driver.find_element(By.ID, "agent-prompt")
        field.send_keys(prompt + Keys.ENTER)

    def agent_log_shows(self, text, seconds=None):
        return self.shows("agent-log", text)

    async def test_an_ask_runs_a_tool_asks_a_question_is_undone_and_stopped(self):
        await self.start_with_opencode()
        c = await self.alice_computer(allow="exec,fs.read,fs.write,screen")
        await self.thread(self.log_in, "token-alice")
        await self.thread(self.click, '#computers button[data-trapos="7:si"]')
        await self.thread(self.shows, "agent-title", "Agent on 7:si")
        await self.thread(self.ask, "leave me a note")
        # The agent's tool needs the player's consent: asked in the page, with what it does.
        await self.thread(self.agent_log_shows, "Allow write_file: /note.txt (")
        self.assertIsNone(c.read_file("/note.txt"))
        await self.thread(self.click, '#agent-log .permission button[data-response="once"]')
        await self.thread(self.agent_log_shows, "tool write_file /note.txt")
        # Its question, answered in the page.
        await self.thread(self.agent_log_shows, "Which colour should the lamp be?")
        self.assertEqual(c.read_file("/note.txt"), NOTE.encode())
        await self.thread(self.click, '#agent-log .question input[value="blue"]')
        await self.thread(self.click, '#agent-log .question button[type="submit"]')
        await self.thread(self.agent_log_shows, "Answered: blue.")
        await self.thread(self.agent_log_shows, CLOSING)
        await self.thread(self.agent_log_shows, "Done: 1 file changed since snapshot")
        results = [text for body in self.model.requests for text in tool_messages(body)]
        self.assertIn('="blue"', results[-1])  # the model got the page's answer
        # The activity: one ask, by alice's operator.
        await self.thread(self.shows, "activity", "ask leave me a note")
        await self.screenshot("TRAPSANDBOX_AGENT_SCREENSHOT", "agent-area")
        # Undo: the snapshot taken before the first change is restored.
        await self.thread(self.click, "#agent-log .end .undo")
        await self.thread(self.click, "#agent-log .end .danger")
        await self.thread(self.agent_log_shows, "Undone: restored snapshot")
        self.assertIsNone(c.read_file("/note.txt"))
        # A new conversation, whose answer starts and never ends: the page stops it.
        self.model.hold, self.model.script, self.model.answer = True, [], "Thinking about it"
        await self.thread(self.click, "#agent-new")
        await self.thread(self.ask, "and now?")
        await self.thread(self.shows, "agent-state", "the agent is working")
        await self.thread(self.agent_log_shows, "Thinking about it")
        await self.thread(self.click, "#agent-stop")
        await self.thread(self.agent_log_shows, "Stopped:")
        send = await self.thread(self.driver.find_element, By.ID, "agent-send")
        self.assertTrue(await self.thread(send.is_enabled))
        await self.thread(self.shows, "activity", "ask and now? · cancelled")
        self.assertEqual(await self.thread(self.no_errors_in_the_page), [])
        # Bob's token: alice's computer cannot be asked about, nor its ask answered.
        await self.thread(self.log_in, "token-bob")
        await self.thread(self.shows, "status", "account bob")
        script = (
            "const done = arguments[arguments.length - 1];"
            "const alice = {traposId: '7:si', accountId: 'alice'};"
            # The page's own module (the same instance: imported by the same URL).
            "import('/console/operator.js').then(({operatorRequest}) => Promise.all(["
            "operatorRequest(alice, 'ask', {prompt: 'hi'}),"
            " operatorRequest(alice, 'ask_cancel', {ask: 'req-1'})]))"
            ".then((all) => done(all.map((a) => [a.status, a.error && a.error.code])));"
        )
        answers = await self.thread(self.driver.execute_async_script, script)
        self.assertEqual(answers, [[404, "not_connected"]] * 2)
