"""SPEC §16 on the CraftOS harness: the real Lua client against the real gateway, with the
harness's peripherals (modelled on CraftOS-PC's emulated ones) and a turtle in a small world."""

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from tests.harness.callers import asking
from tests.lua.test_lua_e2e import PASSWORD, GatewayMixin
from trapsandbox.errors import GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT


class PeripheralTests(GatewayMixin, TestCase):
    async def ready(self, allow="peripheral", turtle=False):
        c = self.computer(label="pe")
        c.set_settings({"sandbox.allow": allow})
        self.world = c.install_world(turtle=turtle)
        for name, kind in (
            ("top", "monitor"),
            ("left", "printer"),
            ("right", "speaker"),
            ("bottom", "drive"),
            ("back", "modem"),
        ):
            self.world[b"attach"](name.encode(), kind.encode())
        await self.start_daemon(c)
        self.c = c
        return c

    def ask(self, type, payload, **kwargs):
        return self.gateway.registry.request(asking("7:pe"), type, payload, timeout=10, **kwargs)

    async def call(self, name, method, *args):
        answer = await self.ask(
            "call_peripheral", {"name": name, "method": method, "args": list(args)}
        )
        return answer

    async def test_list_peripherals_gives_names_types_and_methods(self):
        await self.ready()
        answer = await self.ask("list_peripherals", {})
        self.assertTrue(answer.ok, answer.error)
        found = {p["name"]: p for p in answer.payload["peripherals"]}
        self.assertEqual(list(found), ["top", "left", "right", "bottom", "back"])
        self.assertEqual(found["top"]["types"], ["monitor"])
        self.assertIn("setCursorPos", found["top"]["methods"])
        self.assertIn("transmit", found["back"]["methods"])

    async def test_monitor_write_and_size(self):
        await self.ready()
        for method, args in (("setCursorPos", (2, 3)), ("write", ("hi agent",))):
            answer = await self.call("top", method, *args)
            self.assertTrue(answer.ok, answer.error)
            self.assertEqual(answer.payload["returns"], [])
        size = await self.call("top", "getSize")
        self.assertEqual(size.payload["returns"], [15, 5])
        lines = self.world[b"monitorLines"](b"top")
        self.assertEqual(lines[3], b" hi agent      ")

    async def test_printer_prints_a_page(self):
        await self.ready()
        for method, args in (
            ("newPage", ()),
            ("setPageTitle", ("Note",)),
            ("write", ("from the agent",)),
            ("endPage", ()),
        ):
            answer = await self.call("left", method, *args)
            self.assertTrue(answer.ok, answer.error)
        page = self.world[b"pages"][1]
        self.assertEqual((page[b"title"], page[b"text"]), (b"Note", b"from the agent"))

    async def test_a_failing_call_is_a_peripheral_error_with_craftos_message(self):
        await self.ready()
        answer = await self.call("right", "playNote", "kazoo")
        self.assertEqual(answer.error.code, "peripheral_error")
        self.assertEqual(answer.error.message, 'Invalid instrument, "kazoo"!')
        answer = await self.call("top", "fly")
        self.assertEqual(
            (answer.error.code, answer.error.message), ("peripheral_error", "No such method fly")
        )
        answer = await self.call("north", "getSize")
        self.assertEqual(answer.error.code, "peripheral_error")
        self.assertIn("no peripheral named north", answer.error.message)
        answer = await self.ask("call_peripheral", {"name": "top"})
        self.assertEqual(answer.error.code, "bad_request")

    async def test_lua_values_are_made_json(self):
        c = await self.ready()
        c.eval(
            "local t = { 1, 2, { a = true } } t[3].self = t "
            "harnessWorld.peripherals.top.methods.odd = function() "
            "return t, print, math.huge, nil, 'x' end"
        )
        answer = await self.call("top", "odd")
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(
            answer.payload["returns"],
            [[1, 2, {"a": True, "self": "table"}], "function", "inf", None, "x"],
        )

    async def test_peripheral_events_stream_until_cancelled(self):
        await self.ready()
        events, arrived = [], []

        def on_partial(partial):
            events.append(partial)
            for d in list(arrived):
                arrived.remove(d)
                d.callback(None)

        def next_event():
            d = defer.Deferred()
            arrived.append(d)
            return d.addTimeout(10, reactor)

        stream = self.ask(
            "peripheral_events",
            {"events": ["monitor_touch", "disk", "modem_message"]},
            on_partial=on_partial,
        )
        stream.addErrback(lambda f: f.trap(defer.CancelledError))
        # The watch is registered once list_peripherals (sent after it) is answered.
        await self.ask("list_peripherals", {})
        self.world[b"touch"](b"top", 3, 4)
        await next_event()
        self.assertEqual(
            events[0], {"type": "event", "name": "monitor_touch", "args": ["top", 3, 4]}
        )
        self.world[b"insertDisk"](b"bottom", 5)
        await next_event()
        self.assertEqual(events[1], {"type": "event", "name": "disk", "args": ["bottom"]})
        opened = await self.call("back", "open", 42)
        self.assertTrue(opened.ok, opened.error)
        self.world[b"receive"](b"back", 42, 43, b"ping")
        await next_event()
        self.assertEqual(events[2]["args"], ["back", 42, 43, "ping", 12])
        # A peripheral event not asked for is not sent.
        self.world[b"detach"](b"right")
        disk = await self.call("bottom", "getDiskID")
        self.assertEqual(disk.payload["returns"], [5])
        self.assertEqual(len(events), 3)
        stream.cancel()
        await self.c.wait_for_lua("traposSandboxSession.status().watches == 0")

    async def test_peripheral_events_end_at_the_timeout(self):
        await self.ready()
        answer = await self.ask("peripheral_events", {"timeoutMs": 200})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload, {"events": 0, "timedOut": True})

    async def test_not_allowed_is_forbidden(self):
        await self.ready(allow="screen")
        failure = await self.assertFailure(self.ask("list_peripherals", {}), GatewayError)
        self.assertEqual(failure.code, "forbidden")
        self.assertIn("sandbox allow peripheral", failure.message)


class TurtleTests(GatewayMixin, TestCase):
    async def ready(self, allow="turtle", turtle=True, budget=None):
        c = self.computer(label="tu")
        settings = {"sandbox.allow": allow}
        if budget is not None:
            settings["sandbox.turtle_budget"] = budget
        c.set_settings(settings)
        self.world = c.install_world(turtle=turtle)
        await self.start_daemon(c)
        self.c = c
        return c

    def act(self, action, *args):
        return self.gateway.registry.request(
            asking("7:tu"), "turtle", {"action": action, "args": list(args)}, timeout=10
        )

    async def test_moves_cost_fuel_and_report_it(self):
        await self.ready()
        answer = await self.act("forward")
        self.assertEqual(
            answer.payload, {"returns": [False, "Out of fuel"], "fuel": 0, "selected": 1}
        )
        self.world[b"give"](1, b"minecraft:coal", 2)
        answer = await self.act("refuel", 1)
        self.assertEqual(answer.payload, {"returns": [True], "fuel": 80, "selected": 1})
        answer = await self.act("forward")
        self.assertEqual(answer.payload["returns"], [True])
        self.assertEqual(answer.payload["fuel"], 79)
        state = self.world[b"turtleState"]
        self.assertEqual((state[b"x"], state[b"y"], state[b"z"]), (0, 0, -1))

    async def test_dig_inspect_place_and_the_inventory(self):
        await self.ready()
        self.world[b"block"](0, 0, -1, b"minecraft:stone")
        answer = await self.act("inspect")
        self.assertEqual(
            answer.payload["returns"], [True, {"name": "minecraft:stone", "state": [], "tags": []}]
        )
        self.assertEqual((await self.act("detect")).payload["returns"], [True])
        self.assertEqual((await self.act("dig")).payload["returns"], [True])
        self.assertEqual((await self.act("dig")).payload["returns"], [False, "Nothing to dig here"])
        detail = await self.act("getItemDetail", 1)
        self.assertEqual(detail.payload["returns"], [{"name": "minecraft:stone", "count": 1}])
        self.assertEqual((await self.act("turnLeft")).payload["returns"], [True])
        self.assertEqual((await self.act("place")).payload["returns"], [True])
        self.assertEqual(self.world[b"blockAt"](-1, 0, 0), b"minecraft:stone")
        self.assertEqual((await self.act("place")).payload["returns"], [False, "No items to place"])
        selected = await self.act("select", 5)
        self.assertEqual((selected.payload["returns"], selected.payload["selected"]), ([True], 5))
        bad = await self.act("select", 17)
        self.assertEqual(
            (bad.error.code, bad.error.message), ("peripheral_error", "Slot number 17 out of range")
        )

    # The fake against CC:Tweaked's TurtleAPI.java and its commands (issue 23).

    async def test_the_way_is_checked_before_the_fuel_and_turns_are_free(self):
        await self.ready()
        self.world[b"block"](0, 0, -1, b"minecraft:stone")
        answer = await self.act("forward")
        self.assertEqual(answer.payload["returns"], [False, "Movement obstructed"])
        answer = await self.act("turnRight")
        self.assertEqual((answer.payload["returns"], answer.payload["fuel"]), ([True], 0))
        answer = await self.act("forward")
        self.assertEqual(answer.payload["returns"], [False, "Out of fuel"])

    async def test_refuel_burns_only_what_fits_and_zero_only_checks(self):
        await self.ready()
        self.world[b"turtleState"][b"fuelLimit"] = 200
        self.world[b"give"](1, b"minecraft:coal", 5)
        self.world[b"give"](2, b"minecraft:stone", 1)
        answer = await self.act("refuel", 0)
        self.assertEqual((answer.payload["returns"], answer.payload["fuel"]), ([True], 0))
        self.assertEqual((await self.act("getItemCount", 1)).payload["returns"], [5])
        answer = await self.act("refuel")
        self.assertEqual((answer.payload["returns"], answer.payload["fuel"]), ([True], 200))
        self.assertEqual((await self.act("getItemCount", 1)).payload["returns"], [2])
        bad = await self.act("refuel", -1)
        self.assertEqual(bad.error.message, "Refuel count -1 out of range")
        await self.act("select", 2)
        answer = await self.act("refuel", 0)
        self.assertEqual(answer.payload["returns"], [False, "Items not combustible"])

    async def test_item_counts_are_checked_and_moving_nothing_succeeds(self):
        await self.ready()
        self.assertEqual((await self.act("drop", 0)).payload["returns"], [True])
        self.assertEqual((await self.act("drop")).payload["returns"], [False, "No items to drop"])
        self.assertEqual((await self.act("transferTo", 2)).payload["returns"], [True])
        bad = await self.act("drop", 65)
        self.assertEqual(bad.error.message, "Item count 65 out of range")
        bad = await self.act("suck", -1)
        self.assertEqual(bad.error.message, "Item count -1 out of range")

    async def test_unlimited_fuel_moves_for_free(self):
        await self.ready()
        self.world[b"setFuelNeeded"](False)
        answer = await self.act("forward")
        self.assertEqual(answer.payload, {"returns": [True], "fuel": "unlimited", "selected": 1})
        self.assertEqual((await self.act("getFuelLimit")).payload["returns"], ["unlimited"])

    async def test_unknown_actions_and_a_crafting_table_missing(self):
        await self.ready()
        answer = await self.act("selfDestruct")
        self.assertEqual(answer.error.code, "bad_request")
        answer = await self.act("craft")
        self.assertEqual(answer.error.code, "peripheral_error")

    async def test_not_a_turtle(self):
        await self.ready(turtle=False)
        answer = await self.act("forward")
        self.assertEqual(answer.error.code, "unknown_type")
        self.assertIn("not a turtle", answer.error.message)

    async def test_the_installer_asks_a_turtle_separately(self):
        base = f"http://127.0.0.1:{self.port}"
        for id, drive, expected in (
            (8, "", b"exec,eval,fs.read,fs.write,screen,input,peripheral"),
            (9, "y", b"exec,eval,fs.read,fs.write,screen,input,peripheral,turtle"),
        ):
            c = self.computer(id=id, install=False)
            c.set_settings({"sandbox.url": None, "sandbox.password": None})
            c.install_world(turtle=True)
            proc = c.run(f"wget run {base}/client/install.lua {PASSWORD}")
            await c.wait_for_output("[y/N] ")
            c.type_line("y")
            await c.wait_for_output("a moving machine")
            self.assertIn("This is a turtle. Let the sandbox agent drive it too?", c.output)
            c.type_line(drive)
            ok, err = await proc.done
            self.assertTrue(ok, err)
            self.assertEqual(c.get_setting("sandbox.allow"), expected)


class ConsentTests(GatewayMixin, TestCase):
    """The consent rules of SPEC §16: peripheral and turtle are known to ``sandbox allow``;
    ``all`` and the installer's "y" leave turtle out on a computer that is not a turtle."""

    async def test_sandbox_allow_knows_peripheral_and_turtle_and_all_leaves_turtle_out(self):
        c = self.computer(label="co")
        c.set_settings({"sandbox.allow": None})
        await self.start_daemon(c)
        await c.run("/programs/sandbox.lua allow all").done
        self.assertIn(
            "allowed: exec, eval, fs.read, fs.write, screen, input, peripheral\n", c.output
        )
        await c.run("/programs/sandbox.lua allow turtle").done
        self.assertIn("note: turtle lets the agent drive this turtle, a moving machine", c.output)
        self.assertIn("note: this computer is not a turtle", c.output)
        await c.wait_for_lua("traposSandboxState.capabilities[8] == 'turtle'")
        await self.gateway.registry.request(asking("7:co"), "ping", {}, timeout=10)
        self.assertEqual(
            self.gateway.registry.find(LOCAL_ACCOUNT, "7:co").capabilities,
            {"exec", "eval", "fs.read", "fs.write", "screen", "input", "peripheral", "turtle"},
        )
        await c.run("/programs/sandbox.lua deny peripheral turtle").done
        self.assertEqual(c.get_setting("sandbox.allow"), b"exec,eval,fs.read,fs.write,screen,input")

    async def test_the_installers_y_on_a_computer_allows_peripheral_not_turtle(self):
        base = f"http://127.0.0.1:{self.port}"
        c = self.computer(id=8, install=False)
        c.set_settings({"sandbox.url": None, "sandbox.password": None})
        c.install_world()
        proc = c.run(f"wget run {base}/client/install.lua {PASSWORD}")
        await c.wait_for_output("[y/N] ")
        self.assertIn("use its peripherals?", c.output)
        c.type_line("y")
        ok, err = await proc.done
        self.assertTrue(ok, err)
        self.assertNotIn("This is a turtle", c.output)
        self.assertEqual(
            c.get_setting("sandbox.allow"), b"exec,eval,fs.read,fs.write,screen,input,peripheral"
        )

    async def test_the_installers_allow_all_leaves_a_turtle_undriven(self):
        base = f"http://127.0.0.1:{self.port}"
        c = self.computer(id=9, install=False)
        c.set_settings({"sandbox.url": None, "sandbox.password": None})
        c.install_world(turtle=True)
        ok, err = await c.run(f"wget run {base}/client/install.lua {PASSWORD} --allow=all").done
        self.assertTrue(ok, err)
        self.assertEqual(
            c.get_setting("sandbox.allow"), b"exec,eval,fs.read,fs.write,screen,input,peripheral"
        )


class CtlTests(GatewayMixin, TestCase):
    """trapsandbox-ctl peripherals and call (real processes) against the harness computer."""

    async def ready(self):
        c = self.computer(label="pe")
        c.set_settings({"sandbox.allow": "peripheral"})
        self.world = c.install_world()
        self.world[b"attach"](b"top", b"monitor")
        self.world[b"attach"](b"left", b"printer")
        await self.start_daemon(c)
        return c

    async def test_peripherals_lists_names_types_and_methods(self):
        await self.ready()
        child = self.ctl("peripherals", "7:pe")
        self.assertEqual(await child.wait_ended(10), 0, child.output)
        lines = child.output.splitlines()
        self.assertTrue(lines[0].startswith("top  monitor  clear getCursorPos"), child.output)
        self.assertTrue(lines[1].startswith("left  printer  endPage"), child.output)

    async def test_call_takes_json_args_and_prints_each_return_value(self):
        await self.ready()
        for args in (("setCursorPos", "1", "2"), ("write", "hello")):
            child = self.ctl("call", "7:pe", "top", *args)
            self.assertEqual(await child.wait_ended(10), 0, child.output)
        self.assertEqual(self.world[b"monitorLines"](b"top")[2], b"hello          ")
        child = self.ctl("call", "7:pe", "top", "getSize")
        self.assertEqual(await child.wait_ended(10), 0, child.output)
        self.assertEqual(child.output, "15\n5\n")
        child = self.ctl("call", "7:pe", "top", "fly")
        self.assertEqual(await child.wait_ended(10), 1, child.output)
        self.assertIn("peripheral_error: No such method fly", child.output)


class StopTests(GatewayMixin, TestCase):
    """sandbox stop / resume and the stop side's redstone (SPEC §16) on the harness."""

    async def ready(self, **settings):
        c = self.computer(label="st")
        c.set_settings({"sandbox.allow": "exec,peripheral", **settings})
        self.world = c.install_world()
        self.world[b"attach"](b"top", b"monitor")
        await self.start_daemon(c)
        return c

    def ask(self, type, payload, **kwargs):
        return self.gateway.registry.request(asking("7:st"), type, payload, timeout=10, **kwargs)

    async def test_stop_cancels_what_runs_and_refuses_the_rest_until_resume(self):
        c = await self.ready()
        c.write_file("/nap.lua", "print('napping') sleep(30)")
        run = self.ask("exec", {"command": "nap", "timeoutMs": 20000})
        watch = self.ask("peripheral_events", {})
        await c.wait_for_output("napping")
        await c.wait_for_lua("traposSandboxSession.status().watches == 1")
        proc = c.run("/programs/sandbox.lua stop")
        await proc.done
        self.assertIn('Run "sandbox resume"', c.output)
        for d in (run, watch):
            answer = await d
            self.assertEqual(answer.error.code, "stopped", answer)
            self.assertIn('run "sandbox resume"', answer.error.message)
        # Frames are handled in order: once a ping is answered, the gateway heard of the stop
        # and refuses at once...
        self.assertTrue((await self.ask("ping", {})).ok)
        with self.assertRaises(GatewayError) as caught:
            await self.ask("list_peripherals", {})
        self.assertEqual(caught.exception.code, "stopped")
        self.assertIn('run "sandbox resume"', caught.exception.message)
        # ... and so does the computer, should the gateway believe otherwise.
        session = self.gateway.registry.find(LOCAL_ACCOUNT, "7:st")
        told, session.stopped = session.stopped, None
        refused = await self.ask("list_peripherals", {})
        self.assertEqual(refused.error.code, "stopped")
        session.stopped = told
        status = c.run("/programs/sandbox.lua status")
        await status.done
        self.assertIn("agent: stopped (the player stopped the sandbox agent", c.output)
        await c.run("/programs/sandbox.lua resume").done
        await c.wait_for_lua("not traposSandboxSession.status().agentStopped")
        self.assertTrue((await self.ask("ping", {})).ok)
        answer = await self.ask("list_peripherals", {})
        self.assertTrue(answer.ok, answer.error)

    async def test_a_redstone_signal_on_the_stop_side_stops_the_agent(self):
        c = await self.ready(**{"sandbox.stop_side": "back"})
        watch = self.ask("peripheral_events", {"events": ["monitor_touch"]})
        await c.wait_for_lua("traposSandboxSession.status().watches == 1")
        self.world[b"setRedstone"](b"back", True)
        answer = await watch
        self.assertEqual(answer.error.code, "stopped")
        self.assertIn("redstone signal on the back side", answer.error.message)
        self.assertTrue((await self.ask("ping", {})).ok)
        with self.assertRaises(GatewayError) as caught:
            await self.ask("call_peripheral", {"name": "top", "method": "getSize"})
        self.assertIn("redstone signal on the back side", caught.exception.message)
        self.world[b"setRedstone"](b"back", False)
        await c.wait_for_lua("not traposSandboxSession.status().agentStopped")
        # Frames are handled in order: once a ping is answered, the gateway heard the resume.
        self.assertTrue((await self.ask("ping", {})).ok)
        self.assertIsNone(self.gateway.registry.find(LOCAL_ACCOUNT, "7:st").stopped)
        answer = await self.ask("call_peripheral", {"name": "top", "method": "getSize"})
        self.assertEqual(answer.payload["returns"], [15, 5])
