"""
``sandbox ask`` (SPEC §11) in memory (``opencode.asks``): sessions, the bound
on what is remembered, streaming, cancel, permissions, and the stream
dropping mid-answer, against the fake HTTP client of ``helpers``.
"""

import orjson
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import SES, AskTestsMixin, FakeResponse, build_asks
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient


class AskSessionTests(AskTestsMixin, SynchronousTestCase):
    def test_an_ask_creates_a_session_with_rules_and_sends_the_prompt(self):
        d = self.ask("write a program")
        self.assertNoResult(d)
        sessions = [c for c in self.http.calls if c[:2] == ("POST", "/session")]
        (session,) = sessions
        self.assertEqual(session[3]["title"], "1:a")
        rules = {(r["permission"], r["action"]) for r in session[3]["permission"]}
        self.assertIn(("*", "deny"), rules)
        self.assertIn(("trapsandbox_write_file", "ask"), rules)
        self.assertIn(("trapsandbox_read_file", "allow"), rules)
        self.assertIn(("question", "allow"), rules)  # its questions reach the player
        # Peripherals and turtles (SPEC §16): listing is free, calling and driving asked for.
        self.assertIn(("trapsandbox_list_peripherals", "allow"), rules)
        self.assertIn(("trapsandbox_call_peripheral", "ask"), rules)
        self.assertIn(("trapsandbox_turtle", "ask"), rules)
        (prompt,) = [c for c in self.http.calls if c[1] == f"/session/{SES}/prompt_async"]
        self.assertEqual(prompt[3]["parts"], [{"type": "text", "text": "write a program"}])
        self.assertIn("1:a", prompt[3]["system"])
        self.assertEqual(prompt[2], session[2])  # the same directory
        self.assertEqual(prompt[4], ("opencode", "pw"))
        # The directory's instance gets the computer's own MCP block, token and all, from
        # its opencode.json: the directory was made just now, so opencode makes the instance
        # at the first request naming it (POST /session), reading the file.
        token = self.block()["headers"]["Authorization"].encode()
        self.assertEqual(self.asks.tokens.scope_of(token), ("local", "1:a"))
        self.assertNotIn("/mcp", self.http.paths("POST"))
        self.assertEqual(
            [call[:2] for call in self.http.calls],
            [
                ("GET", "/config/providers"),  # a model to run it with
                ("GET", "/config"),
                ("POST", "/session"),
                ("POST", f"/session/{SES}/prompt_async"),
            ],
        )

    def test_yes_allows_the_changes(self):
        self.ask("x", yes=True)
        (session,) = [c for c in self.http.calls if c[:2] == ("POST", "/session")]
        self.assertIn(
            {"permission": "trapsandbox_write_file", "pattern": "*", "action": "allow"},
            session[3]["permission"],
        )

    def test_one_session_per_account_and_computer_and_new_starts_another(self):
        d = self.ask()
        self.busy()
        self.idle()
        self.successResultOf(d)
        self.ask(message_id="m2")
        self.assertEqual(self.http.sessions, 1)  # the same computer keeps its session
        self.idle()
        self.ask(trapos="2:b")
        self.assertEqual(self.http.sessions, 2)
        self.ask(account="other")  # another account's 1:a is another computer
        self.assertEqual(self.http.sessions, 3)
        self.assertEqual(
            {k: c.session_id for k, c in self.asks.conversations.items()},
            {("local", "1:a"): "ses_1", ("local", "2:b"): "ses_2", ("other", "1:a"): "ses_3"},
        )
        self.assertEqual(self.asks.conversations[("local", "1:a")].session_id, "ses_1")
        self.http.event("session.idle", sessionID="ses_1")  # not started: ignored
        self.assertIn(("local", "1:a"), self.asks.runs)

    def test_new_starts_a_fresh_session(self):
        d = self.ask()
        self.busy()
        self.idle()
        self.successResultOf(d)
        self.ask(new=True)
        self.assertEqual(self.http.sessions, 2)
        self.assertEqual(self.asks.conversations[("local", "1:a")].session_id, "ses_2")

    def test_one_ask_at_a_time_per_computer(self):
        first = self.ask()
        second = self.ask(message_id="m2")
        error = self.failureResultOf(second, GatewayError).value
        self.assertEqual(error.code, errors.OVERLOADED)
        self.assertNoResult(first)
        self.assertEqual(self.http.sessions, 1)
        self.assertEqual(self.http.paths("POST").count(f"/session/{SES}/prompt_async"), 1)
        # Another computer may ask meanwhile.
        self.assertNoResult(self.ask(trapos="2:b"))

    def test_bad_payloads(self):
        for payload in ({"prompt": ""}, {"prompt": 3}, {"prompt": "x", "new": "yes"}):
            d = Deferred.fromCoroutine(
                self.asks.ask("local", "1:a", frozenset(), "m", payload, self.partials.append)
            )
            self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.BAD_REQUEST)
        self.assertEqual(self.http.calls, [])

    def test_with_no_model_provider_the_ask_says_how_the_operator_gives_it_one(self):
        self.http.answers[("GET", "/config/providers")] = {"providers": [], "default": {}}
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("the agent has no model", error.message)
        self.assertIn("ANTHROPIC_API_KEY", error.message)
        self.assertEqual(self.http.sessions, 0)  # no session made, no prompt sent
        self.assertEqual(self.outcome("opencode_error"), 1)
        # A no is not kept: once the operator gave it one, the next ask goes on.
        self.http.answers[("GET", "/config/providers")] = {"providers": [{"id": "p"}]}
        self.assertNoResult(self.ask(message_id="m2"))
        self.assertEqual(self.http.sessions, 1)

    def test_asks_at_once_share_one_look_at_the_providers_and_a_yes_is_kept(self):
        answer = Deferred()
        self.http.answers[("GET", "/config/providers")] = answer
        asks = [self.ask(trapos=f"{n}:a") for n in range(1, 4)]
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 1)
        self.assertEqual(self.http.sessions, 0)
        self.http.answers[("GET", "/config/providers")] = {"providers": [{"id": "p"}]}
        answer.callback(FakeResponse(200, b'{"providers": [{"id": "p"}]}'))
        self.assertEqual(self.http.sessions, 3)
        for d in asks:
            self.assertNoResult(d)
        self.assertNoResult(self.ask(trapos="4:a"))
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 1)
        # opencode reconnected (it may have restarted with another configuration): asked again.
        self.http.drop()
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.assertNoResult(self.ask(trapos="5:a"))
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 2)


class AskBoundTests(AskTestsMixin, SynchronousTestCase):
    """Per account, at most ``max_conversations`` computers are remembered (SPEC §4)."""

    def setUp(self):
        super().setUp()
        self.asks = build_asks(
            self.client, self.clock, self.metrics, directory=self.root, max_conversations=2
        )

    def asked(self, trapos, account="local"):
        d = self.ask(trapos=trapos, account=account)
        session = self.asks.conversations[(account, trapos)].session_id
        self.busy(session)
        self.idle(session)
        self.successResultOf(d)

    def token(self, account, trapos):
        return self.block(trapos, account)["headers"]["Authorization"].encode()

    def test_the_least_recently_asked_computer_is_forgotten(self):
        self.asked("1:a")
        self.asked("2:b")
        self.asked("1:a")  # 1:a is now the most recent
        first_token = self.token("local", "1:a")
        old_token = self.token("local", "2:b")
        self.asked("3:c")
        self.assertEqual(set(self.asks.conversations), {("local", "1:a"), ("local", "3:c")})
        self.assertIsNone(self.asks.tokens.scope_of(old_token))  # its token no longer works
        self.assertEqual(self.asks.tokens.scope_of(first_token), ("local", "1:a"))
        self.assertEqual(len(self.asks.tokens._scopes), 2)
        self.assertEqual(len(self.asks.tokens._token_of), 2)
        self.assertEqual(len(self.asks.directories._scoped), 2)
        # Asking again starts a new session with a new token and block.
        sessions = self.http.sessions
        self.asked("2:b")
        self.assertEqual(self.http.sessions, sessions + 1)
        self.assertEqual(self.asks.tokens.scope_of(self.token("local", "2:b")), ("local", "2:b"))
        self.assertEqual(set(self.asks.conversations), {("local", "3:c"), ("local", "2:b")})

    def test_the_bound_is_per_account(self):
        self.asked("1:a")
        self.asked("2:b")
        self.asked("1:a", account="other")
        self.asked("2:b", account="other")
        self.assertEqual(len(self.asks.conversations), 4)

    def test_a_computer_asking_now_is_not_forgotten(self):
        self.ask(trapos="1:a")  # still running
        self.asked("2:b")
        self.asked("3:c")
        self.assertIn(("local", "1:a"), self.asks.conversations)
        self.assertEqual(set(self.asks.conversations), {("local", "1:a"), ("local", "3:c")})


class AskStreamingTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.http.event("message.updated", info={"id": "msg_u", "sessionID": SES, "role": "user"})
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})
        self.assistant()

    def delta(self, text, part="prt_1", message="msg_a"):
        self.http.event(
            "message.part.delta",
            sessionID=SES,
            messageID=message,
            partID=part,
            field="text",
            delta=text,
        )

    def test_text_deltas_are_batched_and_the_answer_ends_on_idle(self):
        # The first goes at once (the player waits for it), the rest in batches.
        for word in ("Hel", "lo", ", ", "world"):
            self.delta(word)
        self.assertEqual(self.partials, [{"type": "text_delta", "text": "Hel"}])
        self.clock.advance(limits.ASK_PARTIAL_INTERVAL)
        self.assertEqual(self.partials[1:], [{"type": "text_delta", "text": "lo, world"}])
        self.delta("!")
        self.assertNoResult(self.done)
        self.idle()
        self.assertEqual(self.partials[-1], {"type": "text_delta", "text": "!"})
        self.assertEqual(
            self.successResultOf(self.done), {"sessionId": SES, "text": "Hello, world!"}
        )
        self.assertEqual(self.outcome("ok"), 1)
        self.assertNotIn(("local", "1:a"), self.asks.runs)

    def test_a_text_part_update_without_deltas_is_sent(self):
        part = {"id": "prt_1", "sessionID": SES, "messageID": "msg_a", "type": "text"}
        self.http.event("message.part.updated", part={**part, "text": "Whole"})
        self.http.event("message.part.updated", part={**part, "text": "Who"})  # never shrinks
        self.http.event(
            "message.part.updated", part={**part, "id": "s", "text": "x", "synthetic": True}
        )
        self.idle()
        self.assertEqual(self.partials, [{"type": "text_delta", "text": "Whole"}])
        self.assertEqual(self.successResultOf(self.done)["text"], "Whole")

    def test_the_users_own_text_is_not_echoed(self):
        self.delta("my prompt", part="prt_u", message="msg_u")
        self.delta("answer")
        self.idle()
        self.assertEqual(self.successResultOf(self.done)["text"], "answer")

    def test_a_large_burst_is_sent_at_once_in_bounded_pieces(self):
        self.delta("x" * (limits.ASK_PARTIAL_MAX_CHARS * 2 + 5))
        self.assertEqual(
            [len(p["text"]) for p in self.partials],
            [limits.ASK_PARTIAL_MAX_CHARS, limits.ASK_PARTIAL_MAX_CHARS, 5],
        )

    def test_a_second_text_part_is_a_new_paragraph(self):
        self.delta("one", part="prt_1")
        self.clock.advance(limits.ASK_PARTIAL_INTERVAL)
        self.tool("running", input={"path": "/a"})
        self.delta("two", part="prt_2")
        self.idle()
        texts = [p["text"] for p in self.partials if p["type"] == "text_delta"]
        self.assertEqual(texts, ["one", "\n\ntwo"])

    def test_tool_partials(self):
        self.delta("Let me write it.")
        self.tool("pending")
        self.tool("running", input={"path": "/hello.lua", "content": "x"})
        self.tool("running", input={"path": "/hello.lua", "content": "x"})
        self.tool("completed", input={"path": "/hello.lua"}, output="wrote 1 byte")
        self.tool("error", call="call_2", tool="trapsandbox_run_command", error="no such file")
        self.assertEqual(
            self.partials,
            [
                {"type": "text_delta", "text": "Let me write it."},  # flushed before the tool
                # Its arguments as a permission prompt shows them (the console lists them).
                {
                    "type": "tool",
                    "callID": "call_1",
                    "name": "trapsandbox_write_file",
                    "status": "running",
                    "detail": "/hello.lua (1 bytes)",
                },
                {
                    "type": "tool",
                    "callID": "call_1",
                    "name": "trapsandbox_write_file",
                    "status": "completed",
                    "detail": "/hello.lua",
                },
                {
                    "type": "tool",
                    "callID": "call_2",
                    "name": "trapsandbox_run_command",
                    "status": "error",
                    "error": "no such file",
                },
            ],
        )

    def test_a_failed_run_is_an_opencode_error(self):
        self.http.event(
            "session.error",
            sessionID=SES,
            error={"name": "ProviderModelNotFoundError", "data": {"message": "no model fake/x"}},
        )
        self.idle()
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("ProviderModelNotFoundError", error.message)
        self.assertIn("is a model configured", error.message)
        self.assertEqual(self.outcome("run_failed"), 1)

    def test_tokens_are_counted(self):
        self.http.event(
            "message.updated",
            info={
                "id": "msg_a",
                "sessionID": SES,
                "role": "assistant",
                "tokens": {"input": 120, "output": 30},
            },
        )
        self.idle()
        self.successResultOf(self.done)
        self.assertEqual(self.metrics._ask_tokens.labels("input").value, 120)
        self.assertEqual(self.metrics._ask_tokens.labels("output").value, 30)

    def test_the_ten_minute_bound(self):
        self.assertEqual(limits.ASK_TIMEOUT, 600)
        self.clock.advance(limits.ASK_TIMEOUT - 1)
        self.assertNoResult(self.done)
        self.clock.advance(1)
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, errors.TIMEOUT)
        self.assertIn("10 minutes", error.message)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertEqual(self.outcome("timeout"), 1)
        self.assertNotIn(("local", "1:a"), self.asks.runs)

    def test_the_computer_leaving_aborts_the_run(self):
        def gone(message):
            raise GatewayError(errors.NOT_CONNECTED, "gone")

        self.asks.runs[("local", "1:a")].emit = gone
        self.delta("x" * limits.ASK_PARTIAL_MAX_CHARS)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertEqual(
            self.failureResultOf(self.done, GatewayError).value.code, errors.NOT_CONNECTED
        )
        self.assertEqual(self.outcome("disconnected"), 1)


class AskCancelTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask(message_id="m1")
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})

    def test_cancel_aborts_and_the_ask_ends_cancelled(self):
        self.assertIsNone(self.asks.cancel("local", "1:a", "other-message"))
        self.assertIsNone(self.asks.cancel("local", "2:b", "m1"))
        self.assertNotIn(f"/session/{SES}/abort", self.http.paths("POST"))
        d = self.asks.cancel("local", "1:a", "m1")
        self.assertIsNotNone(d)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertNoResult(self.done)
        # What opencode sends after an abort.
        self.http.event("session.error", sessionID=SES, error={"name": "MessageAbortedError"})
        self.idle()
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, errors.CANCELLED)
        self.assertEqual(self.outcome("cancelled"), 1)
        # The computer can ask again, in the same session.
        self.ask(message_id="m2")
        self.assertEqual(self.http.sessions, 1)

    def test_cancel_while_its_session_is_set_up_ends_it_and_the_prompt_never_goes_out(self):
        created = Deferred()
        self.http.answers[("POST", "/session")] = created
        done = self.ask(trapos="2:b", message_id="m9")
        self.assertIsNotNone(self.asks.cancel("local", "2:b", "m9"))
        # (The step in flight ends first, as for a halt; then the set-up goes no further.)
        created.callback(FakeResponse(200, orjson.dumps({"id": "ses_other"})))
        error = self.failureResultOf(done, GatewayError).value
        self.assertEqual(
            (error.code, error.message), (errors.CANCELLED, "cancelled before the agent started")
        )
        self.assertNotIn("/session/ses_other/prompt_async", self.http.paths("POST"))
        self.assertNotIn(("local", "2:b"), self.asks.runs)

    def test_cancel_ends_the_ask_even_if_opencode_never_says_idle(self):
        self.asks.cancel("local", "1:a", "m1")
        self.clock.advance(limits.ASK_ABORT_GRACE)
        self.assertEqual(self.failureResultOf(self.done, GatewayError).value.code, errors.CANCELLED)


class AskHaltTests(AskTestsMixin, SynchronousTestCase):
    """``sandbox stop`` ends the computer's running ask at once (SPEC §16)."""

    STOPPED = GatewayError(errors.STOPPED, 'the player stopped it: on it, run "sandbox resume"')

    def test_halt_aborts_in_opencode_and_ends_the_ask_stopped(self):
        done = self.ask(message_id="m1")
        self.busy()
        self.assertFalse(self.asks.halt("local", "2:b", self.STOPPED))
        self.assertTrue(self.asks.halt("local", "1:a", self.STOPPED))
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertIs(self.failureResultOf(done, GatewayError).value, self.STOPPED)
        self.assertEqual(self.outcome("cancelled"), 1)
        self.assertEqual(self.asks.runs, {})
        self.assertFalse(self.asks.halt("local", "1:a", self.STOPPED))

    def test_halted_while_its_session_is_set_up_the_prompt_never_goes_out(self):
        created = Deferred()
        self.http.answers[("POST", "/session")] = created
        done = self.ask(message_id="m1")
        self.assertTrue(self.asks.halt("local", "1:a", self.STOPPED))
        created.callback(FakeResponse(200, orjson.dumps({"id": SES})))
        self.assertIs(self.failureResultOf(done, GatewayError).value, self.STOPPED)
        self.assertNotIn(f"/session/{SES}/prompt_async", self.http.paths("POST"))
        self.assertEqual(self.asks.runs, {})

    def test_halted_while_set_up_then_opencode_failing_still_ends_it_stopped(self):
        created = Deferred()
        self.http.answers[("POST", "/session")] = created
        done = self.ask(message_id="m1")
        self.assertTrue(self.asks.halt("local", "1:a", self.STOPPED))
        created.callback(FakeResponse(500, b"down"))
        # The player's stop is the answer, not the failure that came after it (and the
        # ask's own Deferred, already failed with it, is not left unhandled).
        self.assertIs(self.failureResultOf(done, GatewayError).value, self.STOPPED)
        self.assertEqual(self.asks.runs, {})


class AskQuestionTests(AskTestsMixin, SynchronousTestCase):
    """The agent's questions (opencode's question tool) reach the player (SPEC §17)."""

    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.assistant()

    def question(self, qid="que_1", **extra):
        self.http.event(
            "question.asked",
            id=qid,
            sessionID=SES,
            questions=[
                {
                    "question": "Which colour?",
                    "header": "Colour",
                    "options": [
                        {"label": "red", "description": "warm"},
                        {"label": "blue", "description": "cold"},
                    ],
                    **extra,
                }
            ],
            tool={"messageID": "msg_a", "callID": "call_q"},
        )

    def questions(self):
        return [p for p in self.partials if p["type"] == "question"]

    def test_a_question_is_shown_and_the_answer_goes_to_opencode(self):
        self.question(multiple=True)
        self.assertEqual(
            self.questions(),
            [
                {
                    "type": "question",
                    "id": "que_1",
                    "questions": [
                        {
                            "question": "Which colour?",
                            "options": [
                                {"label": "red", "description": "warm"},
                                {"label": "blue", "description": "cold"},
                            ],
                            "multiple": True,
                            "custom": True,
                        }
                    ],
                }
            ],
        )
        self.successResultOf(self.asks.answer("local", "1:a", "que_1", [["red", "blue"]], None))
        (call,) = [c for c in self.http.calls if c[1] == "/question/que_1/reply"]
        self.assertEqual((call[0], call[3]), ("POST", {"answers": [["red", "blue"]]}))
        self.assertEqual(call[2], [self.asks.conversations[("local", "1:a")].directory])
        # Answered: a second answer is refused.
        self.assertRaises(GatewayError, self.asks.answer, "local", "1:a", "que_1", [["x"]], None)

    def test_a_rejected_question(self):
        self.question(custom=False)
        self.assertFalse(self.questions()[0]["questions"][0]["custom"])
        self.successResultOf(self.asks.answer("local", "1:a", "que_1", None, True))
        (call,) = [c for c in self.http.calls if c[1].startswith("/question/")]
        self.assertEqual(call[:2], ("POST", "/question/que_1/reject"))

    def test_answers_are_checked(self):
        self.question()
        for answers in (None, [], [["a"], ["b"]], [[]] * 0, [[1]], [[""]], ["red"], [["x" * 2000]]):
            with self.assertRaises(GatewayError) as caught:
                self.asks.answer("local", "1:a", "que_1", answers, None)
            self.assertEqual(caught.exception.code, errors.BAD_REQUEST, answers)
        # Another computer cannot answer this one's question; an unknown id is refused.
        self.assertRaises(GatewayError, self.asks.answer, "local", "2:b", "que_1", [["red"]], None)
        self.assertRaises(GatewayError, self.asks.answer, "local", "1:a", "que_x", [["red"]], None)
        self.assertEqual([c for c in self.http.calls if "/question/" in c[1]], [])

    def test_a_malformed_question_is_not_shown(self):
        self.http.event("question.asked", id="que_2", sessionID=SES, questions="what?")
        self.http.event("question.asked", id=7, sessionID=SES, questions=[{"question": "q"}])
        self.assertEqual(self.questions(), [])

    def test_the_ask_ending_forgets_its_questions(self):
        self.question()
        self.idle()
        self.successResultOf(self.done)
        self.assertRaises(GatewayError, self.asks.answer, "local", "1:a", "que_1", [["red"]], None)


class AskPermissionTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.assistant()

    def permissions(self):
        return [p for p in self.partials if p["type"] == "permission"]

    def test_a_permission_shows_the_known_input_and_the_reply_goes_to_opencode(self):
        self.tool("running", input={"path": "/hello.lua", "content": "print(1)\n"})
        self.permission()
        self.assertEqual(
            self.permissions(),
            [
                {
                    "type": "permission",
                    "id": "per_1",
                    "callID": "call_1",
                    "tool": "trapsandbox_write_file",
                    "detail": "/hello.lua (9 bytes)",
                }
            ],
        )
        self.successResultOf(self.asks.reply("local", "1:a", "per_1", "once"))
        (call,) = [c for c in self.http.calls if c[1] == "/permission/per_1/reply"]
        self.assertEqual((call[0], call[3]), ("POST", {"reply": "once"}))
        self.assertEqual(call[2], [self.asks.conversations[("local", "1:a")].directory])
        # Answered once: a second answer is refused.
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_1", "always")

    def test_replies_are_checked(self):
        self.tool("running", input={"command": "ls"}, tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.assertEqual(self.permissions()[0]["detail"], "ls")
        with self.assertRaises(GatewayError) as caught:
            self.asks.reply("local", "1:a", "per_1", "maybe")
        self.assertEqual(caught.exception.code, errors.BAD_REQUEST)
        # Another computer cannot answer this one's request.
        self.assertRaises(GatewayError, self.asks.reply, "local", "2:b", "per_1", "once")
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_x", "once")
        self.assertEqual([c for c in self.http.calls if "/permission/" in c[1]], [])

    def test_a_permission_before_the_input_waits_for_the_tools_update(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = Deferred()  # slow
        self.tool("pending", tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.assertEqual(self.permissions(), [])
        self.tool(
            "running",
            input={"command": "/hello.lua", "args": ["a"]},
            tool="trapsandbox_run_command",
        )
        self.assertEqual(self.permissions()[0]["detail"], "/hello.lua a")
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(len(self.permissions()), 1)

    def test_a_permission_before_the_input_fetches_the_message(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = {
            "info": {"id": "msg_a"},
            "parts": [
                {"type": "text", "text": "x"},
                {
                    "type": "tool",
                    "callID": "call_1",
                    "tool": "trapsandbox_run_lua",
                    "state": {"status": "running", "input": {"code": "a()\nb()\nc()\nd()\n"}},
                },
            ],
        }
        self.permission(tool="trapsandbox_run_lua")
        self.assertIn(f"/session/{SES}/message/msg_a", self.http.paths("GET"))
        self.assertEqual(self.permissions()[0]["detail"], "a()\nb()\nc()")

    def test_without_the_input_the_pattern_is_shown_in_the_end(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = {"info": {}, "parts": []}
        self.permission()
        self.assertEqual(self.permissions(), [])
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(self.permissions()[0]["detail"], "*")
        self.tool("running", input={"path": "/late"})
        self.assertEqual(len(self.permissions()), 1)  # never twice

    def test_the_ask_ending_drops_a_waiting_permission(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = Deferred()
        self.permission()
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})
        self.idle()
        self.successResultOf(self.done)
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(self.permissions(), [])
        waiting = [c for c in self.clock.getDelayedCalls() if "release" in repr(c.func)]
        self.assertEqual(waiting, [])


class AskFaultTests(AskTestsMixin, SynchronousTestCase):
    def test_no_url(self):
        asks = build_asks(
            OpencodeClient(self.http, self.clock, ""), self.clock, directory=self.mktemp()
        )
        d = Deferred.fromCoroutine(asks.ask("local", "1:a", frozenset(), "m", {"prompt": "x"}, id))
        self.assertIn("OPENCODE_URL", self.failureResultOf(d, GatewayError).value.message)

    def test_the_stream_dropping_mid_answer_and_the_session_idle_meanwhile(self):
        d = self.ask()
        self.assistant()
        self.http.event(
            "message.part.delta", sessionID=SES, messageID="msg_a", partID="p", delta="Half"
        )
        self.http.auto_stream = False
        self.http.drop()
        self.assertNoResult(d)
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.http.stream_gets[-1].errback(ConnectionRefusedError())
        self.clock.advance(2 * limits.EVENT_RECONNECT_MIN)
        self.assertNotIn("/session/status", self.http.paths("GET"))
        self.http.open()  # back: opencode says the session is not busy any more
        self.assertIn("/session/status", self.http.paths("GET"))
        self.assertEqual(self.successResultOf(d), {"sessionId": SES, "text": "Half"})

    def test_the_stream_dropping_while_the_session_is_still_busy(self):
        d = self.ask()
        self.assistant()
        self.http.answers[("GET", "/session/status")] = {SES: {"type": "busy"}}
        self.http.drop()
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.assertIn("/session/status", self.http.paths("GET"))
        self.assertNoResult(d)  # still running: its events come on the new stream
        self.http.event(
            "message.part.delta", sessionID=SES, messageID="msg_a", partID="p", delta="Done"
        )
        self.idle()
        self.assertEqual(self.successResultOf(d)["text"], "Done")
