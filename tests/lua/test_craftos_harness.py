"""The CraftOS harness against real loopback servers: websockets, http.get, JSON, timers,
parallel, settings, several processes on one computer."""

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase
from twisted.web import resource, server, static

from tests.harness.craftos import Computer


class EchoProtocol(WebSocketServerProtocol):
    """Echoes text; `close:<code>:<reason>` closes with a code, `drop` drops the TCP link."""

    def onOpen(self):
        self.factory.opened.append(self)

    def onMessage(self, payload, isBinary):
        self.factory.received.append(payload)
        if payload.startswith(b"close:"):
            _, code, reason = payload.decode().split(":", 2)
            self.sendClose(int(code), reason)
        elif payload == b"drop":
            self.transport.abortConnection()
        else:
            self.sendMessage(payload, isBinary)

    def onClose(self, wasClean, code, reason):
        self.factory.closed.append(code)


class HarnessTestCase(TestCase):
    timeout = 15

    def setUp(self):
        factory = WebSocketServerFactory()
        factory.protocol = EchoProtocol
        factory.opened, factory.received, factory.closed = [], [], []
        self.ws = factory
        root = resource.Resource()
        root.putChild(b"echo", WebSocketResource(factory))
        root.putChild(b"hello.txt", static.Data(b"hello\nworld", "text/plain"))
        site = server.Site(root)
        self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.base = f"127.0.0.1:{self.port.getHost().port}"

    def computer(self, id=1, label=None, **kwargs):
        computer = Computer(self.mktemp(), id=id, label=label, **kwargs)
        self.addCleanup(computer.shutdown)
        return computer

    def server_side_closed(self, count=1):
        return self.eventually(lambda: len(self.ws.closed) >= count)

    def eventually(self, predicate, timeout=5.0):
        """Waits on server-side state by polling the reactor, bounded."""
        d = defer.Deferred()
        deadline = reactor.seconds() + timeout

        def check():
            if predicate():
                d.callback(None)
            elif reactor.seconds() > deadline:
                d.errback(TimeoutError("server-side condition not met"))
            else:
                reactor.callLater(0.01, check)

        check()
        return d

    @defer.inlineCallbacks
    def test_websocket_events(self):
        c = self.computer()
        url = f"ws://{self.base}/echo?n=1"
        proc = c.run_lua(f"""
          local url = {url!r}
          assert(http.websocketAsync(url, {{}}))
          local ev, u, ws = os.pullEvent('websocket_success')
          print('success', u == url, type(ws.send), type(ws.close))
          ws.send('ping \\195\\169')
          local _, u2, msg, binary = os.pullEvent('websocket_message')
          print('message', u2 == url, msg == 'ping \\195\\169', binary)
          ws.send('close:4000:replaced')
          local e = table.pack(os.pullEvent('websocket_closed'))
          print('closed', e.n, e[2] == url, e[3], e[4])
        """)
        ok, err = yield proc.done
        self.assertEqual((ok, err), (True, None))
        self.assertIn("success\ttrue\tfunction\tfunction", c.output)
        self.assertIn("message\ttrue\ttrue\tfalse", c.output)
        self.assertIn("closed\t4\ttrue\treplaced\t4000", c.output)
        self.assertEqual(self.ws.received[0], "ping é".encode())

    @defer.inlineCallbacks
    def test_dropped_connection_gives_only_the_url(self):
        c = self.computer()
        url = f"ws://{self.base}/echo"
        proc = c.run_lua(f"""
          local ws = http.websocket({url!r})
          ws.send('drop')
          local e = table.pack(os.pullEvent('websocket_closed'))
          print('closed', e.n, e[2])
          print('send after close', pcall(ws.send, 'x'))
        """)
        yield proc.done
        self.assertIn(f"closed\t2\t{url}", c.output)
        self.assertIn("send after close\tfalse", c.output)

    @defer.inlineCallbacks
    def test_local_close_queues_nothing_like_cc_tweaked(self):
        c = self.computer()
        url = f"ws://{self.base}/echo"
        proc = c.run_lua(f"""
          local ws = http.websocket({url!r})
          ws.close()
          local timer = os.startTimer(0.3)
          while true do
            local e, a = os.pullEvent()
            if e == 'websocket_closed' then print('unexpected close event') break end
            if e == 'timer' and a == timer then print('quiet') break end
          end
          ws.close()
        """)
        yield proc.done
        self.assertIn("quiet", c.output)
        yield self.server_side_closed()
        self.assertEqual(self.ws.closed, [1006])  # no close frame was sent
        self.assertEqual(c.violations, ["closed a websocket handle twice"])

    @defer.inlineCallbacks
    def test_craftos_pc_close_mode_queues_closed(self):
        c = self.computer(close_mode="craftos-pc")
        url = f"ws://{self.base}/echo"
        proc = c.run_lua(f"""
          local ws = http.websocket({url!r})
          ws.close()
          local e = table.pack(os.pullEvent('websocket_closed'))
          print('closed', e[2] == {url!r}, e[4])
        """)
        yield proc.done
        self.assertIn("closed\ttrue\t1000", c.output)

    @defer.inlineCallbacks
    def test_websocket_failure_and_limits(self):
        unused = reactor.listenTCP(0, server.Site(resource.Resource()), interface="127.0.0.1")
        dead_port = unused.getHost().port
        yield unused.stopListening()
        c = self.computer()
        proc = c.run_lua(f"""
          local url = 'ws://127.0.0.1:{dead_port}/x'
          http.websocketAsync(url)
          local _, u, err = os.pullEvent('websocket_failure')
          print('failure', u == url, type(err))
          local notWs = 'ws://{self.base}/hello.txt'
          http.websocketAsync(notWs)
          local _, u2 = os.pullEvent('websocket_failure')
          print('not a websocket', u2 == notWs)
          print('empty send')
          local ws = http.websocket('ws://{self.base}/echo')
          ws.send('')
        """)
        yield proc.done
        self.assertIn("failure\ttrue\tstring", c.output)
        self.assertIn("not a websocket\ttrue", c.output)
        self.assertIn("sent an empty string on a websocket", c.violations)

    @defer.inlineCallbacks
    def test_at_most_four_websockets(self):
        c = self.computer()
        proc = c.run_lua(f"""
          for i = 1, 4 do assert(http.websocket('ws://{self.base}/echo?i=' .. i)) end
          print('fifth', http.websocketAsync('ws://{self.base}/echo?i=5'))
        """)
        yield proc.done
        self.assertIn("fifth\tfalse\tToo many websockets already open", c.output)

    @defer.inlineCallbacks
    def test_http_get(self):
        c = self.computer()
        proc = c.run_lua(f"""
          local h = http.get('http://{self.base}/hello.txt')
          print('code', h.getResponseCode())
          print('line', h.readLine())
          print('rest', h.readAll())
          h.close()
          local none, err, failed = http.get('http://{self.base}/missing')
          print('missing', none, err ~= nil, failed and failed.getResponseCode())
        """)
        ok, err = yield proc.done
        self.assertTrue(ok, err)
        self.assertIn("code\t200", c.output)
        self.assertIn("line\thello", c.output)
        self.assertIn("rest\tworld", c.output)
        self.assertIn("missing\tnil\ttrue\t404", c.output)

    @defer.inlineCallbacks
    def test_json_follows_craftos_rules(self):
        c = self.computer()
        proc = c.run_lua(r"""
          local j = textutils.serializeJSON
          print(j({}))
          print(j({ a = 'x\127\128\255"\\\n' }))
          print(j({ 1, 2, nil, 'z' }))
          print(j({ 1, k = true }))
          print(j(textutils.empty_json_array), j({ n = textutils.json_null }))
          local v = textutils.unserializeJSON('{"a":[],"b":null,"c":[1,{"d":"\\u0041"}]}')
          print(v.a == textutils.empty_json_array, v.b, v.c[2].d)
          print(pcall(function() v.a[1] = 1 end))
          print(textutils.unserializeJSON('{"a":'))
          print(textutils.unserializeJSON('[1] x'))
          print(textutils.unserializeJSON("[]", { parse_empty_array = false })
            == textutils.empty_json_array)
        """)
        ok, err = yield proc.done
        self.assertTrue(ok, err)
        lines = c.output.splitlines()
        self.assertEqual(lines[0], "{}")
        self.assertEqual(lines[1], r'{"a":"x\u007F\u0080\u00FF\"\\\n"}')
        self.assertEqual(lines[2], '[1,2,null,"z"]')
        self.assertEqual(lines[3], '{"k":true}')
        self.assertEqual(lines[4], '[]\t{"n":null}')
        self.assertEqual(lines[5], "true\tnil\tA")
        self.assertTrue(lines[6].startswith("false\t"))
        self.assertTrue(lines[7].startswith("nil\tMalformed JSON at position"))
        self.assertTrue(lines[8].startswith("nil\tMalformed JSON at position 5"))
        self.assertEqual(lines[9], "false")

    @defer.inlineCallbacks
    def test_timers_and_parallel(self):
        c = self.computer()
        proc = c.run_lua("""
          local cancelled = os.startTimer(0.05)
          os.cancelTimer(cancelled)
          local seen = {}
          local which = parallel.waitForAny(
            function()
              while true do
                local e, a = os.pullEvent()
                if e == 'timer' and a == cancelled then print('cancelled timer fired') end
                if e == 'custom' then seen[#seen + 1] = 'one:' .. a end
              end
            end,
            function()
              os.queueEvent('custom', 'x')
              local _, a = os.pullEvent('custom')
              seen[#seen + 1] = 'two:' .. a
              sleep(0.1)
            end)
          table.sort(seen)
          print('winner', which, table.concat(seen, ','))
          parallel.waitForAll(function() sleep(0.02) end, function() sleep(0.01) end)
          print('all done', os.clock() >= 0)
        """)
        ok, err = yield proc.done
        self.assertTrue(ok, err)
        self.assertIn("winner\t2\tone:x,two:x", c.output)
        self.assertIn("all done\ttrue", c.output)
        self.assertNotIn("cancelled timer fired", c.output)

    @defer.inlineCallbacks
    def test_processes_share_events(self):
        c = self.computer(id=5, label="lab")
        first = c.run_lua("local _, v = os.pullEvent('go') print('first got ' .. v)")
        second = c.run_lua("local _, v = os.pullEvent('go') print('second got ' .. v)")
        c.queue_event("go", "now")
        yield defer.gatherResults([first.done, second.done])
        self.assertIn("first got now", c.output)
        self.assertIn("second got now", c.output)
        self.assertEqual(c.eval("return os.getComputerID(), os.getComputerLabel()"), (5, b"lab"))

    @defer.inlineCallbacks
    def test_queue_drops_events_past_256(self):
        c = self.computer()
        proc = c.run_lua("""
          for i = 1, 300 do os.queueEvent('e', i) end
          local n = 0
          os.queueEvent('end')
          while true do
            local e = os.pullEvent()
            if e == 'e' then n = n + 1 elseif e == 'end' then break end
          end
          print('got', n)
        """)
        timeout = c.wait_for(lambda: proc.finished, timeout=2)
        yield timeout.addErrback(lambda f: None)
        # 'end' is dropped too (the queue is full), so the program never finishes.
        self.assertFalse(proc.finished)
        self.assertEqual(c.kernel[b"dropped"], 45)

    @defer.inlineCallbacks
    def test_settings_persist_and_programs_run(self):
        root = self.mktemp()
        c = Computer(root, id=2)
        self.addCleanup(c.shutdown)
        c.write_file("/programs/hi.lua", "print('hi ' .. table.concat({...}, '+'))")
        proc = c.run("set sandbox.url ws://example/gateway")
        yield proc.done
        proc = c.run_lua("""
          settings.define('x.y', { description = 'a thing', default = 'dflt', type = 'string' })
          print('default', settings.get('x.y'), settings.getDetails('x.y').description)
          shell.setAlias('hi', '/programs/hi.lua')
          shell.run('hi a "b c"')
          print('missing', shell.run('nope'))
        """)
        yield proc.done
        self.assertIn("default\tdflt\ta thing", c.output)
        self.assertIn("hi a+b c", c.output)
        self.assertIn("No such program", c.errors)
        yield c.shutdown()
        again = Computer(root, id=2)
        self.addCleanup(again.shutdown)
        self.assertEqual(again.get_setting("sandbox.url"), b"ws://example/gateway")

    @defer.inlineCallbacks
    def test_read_and_wget_run(self):
        c = self.computer()
        root = resource.Resource()
        root.putChild(
            b"prog.lua",
            static.Data(
                b"local a = ... write('name? ') print('hello ' .. read() .. ' ' .. a)", "text/plain"
            ),
        )
        port = reactor.listenTCP(0, server.Site(root), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        proc = c.run(f"wget run http://127.0.0.1:{port.getHost().port}/prog.lua arg1")
        yield c.wait_for_output("name? ")
        c.type_line("steve")
        yield proc.done
        self.assertIn("hello steve arg1", c.output)

    @defer.inlineCallbacks
    def test_read_draws_each_key_as_it_is_typed(self):
        # As CraftOS's read(): a watcher of the screen sees each char before Enter.
        c = self.computer()
        proc = c.run_lua("write('name? ') R = read() print('hello ' .. R)")
        yield c.wait_for_output("name? ")
        for char in "ab":
            c.queue_event("char", char)
        c.queue_event("key", 259, False)  # backspace (GLFW code, as CC:Tweaked)
        c.queue_event("char", "x")
        yield c.wait_for(lambda: c.screen_lines()[0].startswith("name? ax"), what="the echo")
        self.assertEqual(c.screen_lines()[0].rstrip(), "name? ax")
        c.type_line("y")
        yield proc.done
        self.assertEqual(c.screen_lines()[:2], ["name? axy".ljust(51), "hello axy".ljust(51)])

    @defer.inlineCallbacks
    def test_wait_for_output_times_out_with_the_transcript(self):
        c = self.computer()
        c.run_lua("print('something else')")
        with self.assertRaises(TimeoutError) as caught:
            yield c.wait_for_output("never printed", timeout=0.2)
        self.assertIn("something else", str(caught.exception))
