"""
opencode in the gateway's care (issue 45), on the real thing: ``twistd -n trapsandbox``
with ``OPENCODE_URL`` unset runs the real ``opencode serve`` (npm opencode-ai) itself,
its agent the scripted model; a computer asks; opencode is killed and comes back in the
same conversation; the gateway's stop, and its SIGKILL, leave no opencode behind; a
missing program is said, and the gateway serves without it.
"""

import json
import os
import re

import orjson
import treq
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.fake_model import start_fake_model
from tests.harness.opencode import OFFLINE, OPENCODE
from tests.harness.processes import spawn_gateway
from tests.harness.support import bounded, closed_port, connect, reactor
from trapsandbox.ops import ctl

TOKEN = "managed-test-admin-token"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie is gone but for its parent
    except FileNotFoundError:
        return False


async def gone(pid: int, seconds: float = 15) -> bool:
    """Whether ``pid`` is gone within ``seconds`` (looked at every 0.1 s)."""
    deadline = reactor().seconds() + seconds
    while alive(pid):
        if reactor().seconds() > deadline:
            return False
        await deferLater(reactor(), 0.1, lambda: None)
    return True


class ManagedOpencodeTests(TestCase):
    timeout = 180

    async def start(self, model=True, **env):
        """A twistd gateway running opencode itself, its agent the scripted model (or, without
        ``model``, an opencode with no model provider at all)."""
        self.port = closed_port()
        home = os.path.abspath(self.mktemp())
        config_dir = os.path.join(home, ".config", "opencode")
        os.makedirs(config_dir)
        config = ctl.opencode_config(f"http://127.0.0.1:{self.port}", True)
        if model:
            self.model = await start_fake_model(
                self, "trapsandbox_list_computers", {}, answer="Managed hello."
            )
            config.update(self.model.opencode_config())
        else:
            # opencode 1.18.33's one provider without a key (opencode.ai's own) disabled.
            config["disabled_providers"] = ["opencode"]
        with open(os.path.join(config_dir, "opencode.json"), "w") as f:
            json.dump(config, f)
        environ = {
            "OPENCODE_URL": None,  # unset: the gateway's own
            "SANDBOX_OPENCODE_BIN": OPENCODE,
            "HOME": home,
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
            **OFFLINE,
            "SANDBOX_ADMIN_TOKEN": TOKEN,
            "SANDBOX_STATE_DIR": os.path.join(home, "state"),
            **env,
        }
        self.gateway = spawn_gateway(self, port=self.port, **environ)
        self.pool = HTTPConnectionPool(reactor(), persistent=False)
        return self.gateway

    async def health(self):
        response = await bounded(
            treq.get(f"http://127.0.0.1:{self.port}/health", pool=self.pool), 10
        )
        return orjson.loads(await bounded(treq.content(response), 10))

    async def ask(self, computer, prompt, partials=None):
        """The final answer to an ask (its partials into ``partials``, if given)."""
        # (A first text, or a restart, under load takes longer than the harness's 10 s.)
        message = await computer.request("ask", {"prompt": prompt}, seconds=60)
        while message.get("partial"):
            if partials is not None:
                partials.append(message["payload"])
            message = await computer.next_message(seconds=90)
        return message

    async def test_it_runs_opencode_answers_asks_and_brings_it_back_in_the_conversation(self):
        gateway = await self.start()
        await gateway.wait_for(r"opencode: ready", 60)
        health = await self.health()
        self.assertTrue(health["opencodeOk"], health)
        [server] = health["opencodeManaged"]
        self.assertEqual((server["state"], server["restarts"]), ("ready", {}))
        pid = server["pid"]
        self.assertTrue(alive(pid))
        # The password it made is in opencode's environment, never in the log.
        with open(f"/proc/{pid}/environ", "rb") as f:
            password = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)[
                b"OPENCODE_SERVER_PASSWORD"
            ].decode()
        self.assertGreaterEqual(len(password), 24)

        computer = await connect(self, self.port)
        self.assertTrue((await computer.hello(trapos_id="5:managed"))["ok"])
        first = await self.ask(computer, "the first question")
        self.assertTrue(first["ok"], first)
        self.assertIn("Managed hello.", json.dumps(first["payload"]))
        self.assertEqual((await self.health())["opencodeManaged"][0]["instances"], 1)

        # Killed: started again, and the next ask goes on in the same conversation.
        os.kill(pid, 9)
        await gateway.wait_for(r"opencode: it was killed by SIGKILL.*; starting it again", 15)
        await gateway.wait_for(r"(?s)killed by SIGKILL.*opencode: ready", 60)
        health = await self.health()
        [server] = health["opencodeManaged"]
        self.assertEqual((server["state"], server["restarts"]), ("ready", {"killed": 1}))
        self.assertNotEqual(server["pid"], pid)
        self.assertEqual(server["instances"], 0)  # the old process's went with it
        response = await bounded(
            treq.get(
                f"http://127.0.0.1:{self.port}/metrics",
                headers={"Authorization": f"Bearer {TOKEN}"},
                pool=self.pool,
            ),
            10,
        )
        metrics = (await bounded(treq.content(response), 10)).decode()
        for line in (
            'trapsandbox_opencode_managed_state{server="opencode",state="ready"} 1.0',
            'trapsandbox_opencode_managed_restarts_total{reason="killed",server="opencode"} 1.0',
            f'trapsandbox_opencode_managed_pid{{server="opencode"}} {float(server["pid"])}',
        ):
            self.assertIn(line, metrics.splitlines())
        second = await self.ask(computer, "the second question")
        self.assertTrue(second["ok"], second)
        last = json.dumps(self.model.requests[-1]["messages"])
        self.assertIn("the first question", last)  # opencode kept the conversation
        self.assertIn("the second question", last)
        self.assertNotIn(password, gateway.output)

        # The gateway's stop stops it.
        pid = server["pid"]
        gateway.signal("TERM")
        await gateway.wait_ended(30)
        self.assertTrue(await gone(pid, 1))

    async def test_past_its_memory_bound_it_is_recycled_between_asks(self):
        # 1 MB: every ask's end finds it past the bound.
        gateway = await self.start(SANDBOX_OPENCODE_MAX_RSS_MB="1")
        await gateway.wait_for(r"opencode: ready", 60)
        computer = await connect(self, self.port)
        self.assertTrue((await computer.hello(trapos_id="6:recycled"))["ok"])
        first = await self.ask(computer, "before the recycle")
        self.assertTrue(first["ok"], first)  # whole: the recycle waited for it
        await gateway.wait_for(r"opencode: past its memory bound: draining", 15)
        # Asked while it restarts (it takes seconds to answer again): the ask waits, told so,
        # then goes on in its conversation.
        partials = []
        second = await self.ask(computer, "after the recycle", partials)
        self.assertTrue(second["ok"], second)
        told = [p.get("text") or "" for p in partials]
        self.assertTrue(
            any("give back its memory" in t and "your ask waits for it)\n" in t for t in told),
            told,
        )
        self.assertIn("before the recycle", json.dumps(self.model.requests[-1]["messages"]))
        [server] = (await self.health())["opencodeManaged"]
        self.assertGreaterEqual(server["restarts"]["recycled"], 1)

    async def test_with_no_model_an_ask_says_how_the_operator_gives_it_one(self):
        gateway = await self.start(model=False)
        await gateway.wait_for(r"opencode: ready", 60)
        computer = await connect(self, self.port)
        self.assertTrue((await computer.hello(trapos_id="7:nomodel"))["ok"])
        answer = await self.ask(computer, "hello?")
        self.assertFalse(answer["ok"], answer)
        self.assertEqual(answer["error"]["code"], "opencode_error")
        self.assertIn("the agent has no model", answer["error"]["message"])
        self.assertIn("opencode auth login", answer["error"]["message"])

    async def test_a_killed_gateway_leaves_no_opencode(self):
        gateway = await self.start()
        await gateway.wait_for(r"opencode: ready", 60)
        [server] = (await self.health())["opencodeManaged"]
        gateway.signal("KILL")
        await gateway.wait_ended(10)
        self.assertTrue(await gone(server["pid"]), "opencode outlived a SIGKILLed gateway")

    async def test_a_missing_program_is_said_and_the_gateway_serves(self):
        gateway = await self.start(SANDBOX_OPENCODE_BIN="/nonexistent/opencode")
        line = await gateway.wait_for(r"opencode: .*not found.*", 30)
        self.assertIn("/nonexistent/opencode", line.group())
        health = await self.health()
        self.assertFalse(health["opencodeOk"])
        self.assertEqual(
            health["opencodeDetail"],
            "opencode will not start: '/nonexistent/opencode' was not found on PATH",
        )
        self.assertEqual(health["opencodeManaged"][0]["state"], "failed")
        computer = await connect(self, self.port)
        self.assertTrue((await computer.hello())["ok"])
        reply = await computer.request("probe_gateway")
        self.assertFalse(reply["payload"]["opencodeOk"])
        self.assertIn("will not start", reply["payload"]["opencodeDetail"])
        self.assertIsNone(re.search(r"Traceback", gateway.output))
