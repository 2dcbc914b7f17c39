"""
The snapshot before an ask's first change, and the count at its end (``snapshots.askhook``,
SPEC §15), on a fake ``Snapshots`` and a ``Clock``; then through ``Asks`` (a run's state)
and the MCP endpoint (only an ask token's changing calls wait).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import mcp_caller
from tests.harness.fakes import SandboxComputer
from tests.harness.logcapture import LogCapture
from tests.unit.opencode.helpers import SES, AskTestsMixin, build_asks
from trapsandbox import errors, limits
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.mcp.jsonrpc import Call
from trapsandbox.ops.metrics import Metrics
from trapsandbox.snapshots.askhook import AskSnapshots

READ = frozenset({"fs.read", "fs.write"})
NO_CHANGES = {"added": [], "modified": [], "deleted": [], "diffs": []}


class FakeSnapshots:
    """``take`` answers with the Deferreds the test queues (or a new one it keeps)."""

    def __init__(self) -> None:
        self.takes: list[tuple[str, str, str]] = []
        self.taking: list[Deferred] = []
        self.found: object = NO_CHANGES
        self.compared: list[str] = []
        self.cancelled = 0

    def take(self, caller, reason):
        self.takes.append((*caller.key, reason))
        d: Deferred = Deferred(lambda _: setattr(self, "cancelled", self.cancelled + 1))
        self.taking.append(d)
        return d

    def changes(self, caller, snapshot_id):
        self.compared.append(snapshot_id)
        if isinstance(self.found, Exception):
            return fail(self.found)
        return succeed(self.found)


class Run:
    def __init__(self, key=("acc", "7:a")) -> None:
        self.key = key
        self.snapshot = None


def said(logs: LogCapture) -> list[str]:
    return [formatEvent(event) for event in logs.events]


class BeforeChangeTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.snapshots = FakeSnapshots()
        self.hook = AskSnapshots(self.snapshots, self.clock)

    def test_the_first_change_of_a_run_waits_for_one_ask_snapshot(self):
        run = Run()
        first = self.hook.before_change(run, READ)
        self.assertEqual(self.snapshots.takes, [("acc", "7:a", "ask")])
        self.assertNoResult(first)
        self.snapshots.taking[0].callback({"id": "3", "files": 1, "bytes": 5, "fetched": 1})
        self.assertIsNone(self.successResultOf(first))
        # Later changes in the same run go ahead at once, without another snapshot.
        self.assertIsNone(self.successResultOf(self.hook.before_change(run, READ)))
        self.assertEqual(len(self.snapshots.takes), 1)
        # A new run takes its own.
        self.assertNoResult(self.hook.before_change(Run(), READ))
        self.assertEqual(len(self.snapshots.takes), 2)

    def test_concurrent_changes_share_the_one_snapshot(self):
        run = Run()
        waiting = [self.hook.before_change(run, READ) for _ in range(3)]
        self.assertEqual(len(self.snapshots.takes), 1)
        # One caller gives up (its client cancelled the call): the others still wait.
        waiting[0].cancel()
        self.failureResultOf(waiting[0])
        self.assertEqual(self.snapshots.cancelled, 0)
        for d in waiting[1:]:
            self.assertNoResult(d)
        self.snapshots.taking[0].callback({"id": "1"})
        for d in waiting[1:]:
            self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.successResultOf(self.hook.closing(run, {"text": "x"})), {"text": "x"})

    def test_without_fs_read_nothing_is_taken_and_the_change_goes_ahead(self):
        run = Run()
        logs = LogCapture(self)
        d = self.hook.before_change(run, frozenset({"exec", "fs.write"}))
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.snapshots.takes, [])
        self.assertIsNone(run.snapshot)
        self.assertEqual(said(logs), [])
        # Nothing to compare with: the ask ends without the line.
        self.assertEqual(self.successResultOf(self.hook.closing(run, {"text": "x"})), {"text": "x"})

    def test_a_refused_snapshot_is_logged_once_and_the_changes_go_ahead(self):
        run = Run()
        logs = LogCapture(self)
        first = self.hook.before_change(run, READ)
        second = self.hook.before_change(run, READ)
        self.snapshots.taking[0].errback(
            GatewayError(errors.TOO_LARGE, "the computer's files take 5000000 bytes: ...")
        )
        self.assertIsNone(self.successResultOf(first))
        self.assertIsNone(self.successResultOf(second))
        self.assertIsNone(self.successResultOf(self.hook.before_change(run, READ)))
        self.assertEqual(len(self.snapshots.takes), 1)  # not tried again in this run
        lines = [line for line in said(logs) if "no snapshot" in line]
        self.assertEqual(len(lines), 1, said(logs))
        self.assertIn("7:a", lines[0])
        self.assertIn("5000000 bytes", lines[0])
        self.assertIn("the change goes ahead", lines[0])
        # No snapshot, no line at the end.
        self.assertEqual(self.successResultOf(self.hook.closing(run, {"text": "x"})), {"text": "x"})
        self.assertEqual(self.snapshots.compared, [])

    def test_a_snapshot_past_its_bound_is_cancelled_and_the_change_goes_ahead(self):
        run = Run()
        logs = LogCapture(self)
        d = self.hook.before_change(run, READ)
        self.clock.advance(limits.ASK_SNAPSHOT_TIMEOUT - 0.1)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        self.assertIsNone(self.successResultOf(d))
        # Cancelled: the requests on the computer stop; nothing was committed.
        self.assertEqual(self.snapshots.cancelled, 1)
        (line,) = [line for line in said(logs) if "no snapshot" in line]
        self.assertIn(f"took longer than {limits.ASK_SNAPSHOT_TIMEOUT:g} s", line)


class ClosingTests(SynchronousTestCase):
    def setUp(self):
        self.snapshots = FakeSnapshots()
        self.hook = AskSnapshots(self.snapshots, Clock())
        self.run = Run()
        self.hook.before_change(self.run, READ)
        self.snapshots.taking[0].callback({"id": "4"})

    def test_counts_added_modified_and_deleted_since_the_runs_snapshot(self):
        self.snapshots.found = {
            "added": [{"path": "/a"}, {"path": "/b"}],
            "modified": [{"path": "/c"}],
            "deleted": [{"path": "/d"}],
            "diffs": [],
        }
        result = self.successResultOf(self.hook.closing(self.run, {"sessionId": SES, "text": "t"}))
        self.assertEqual(result, {"sessionId": SES, "text": "t", "changed": 4})
        self.assertEqual(self.snapshots.compared, ["4"])

    def test_nothing_changed_adds_nothing(self):
        result = self.successResultOf(self.hook.closing(self.run, {"text": "t"}))
        self.assertEqual(result, {"text": "t"})

    def test_a_failed_count_ends_the_ask_without_the_line(self):
        self.snapshots.found = GatewayError(errors.NOT_CONNECTED, "the computer left")
        logs = LogCapture(self)
        result = self.successResultOf(self.hook.closing(self.run, {"text": "t"}))
        self.assertEqual(result, {"text": "t"})
        self.assertTrue([line for line in said(logs) if "the computer left" in line])


class Session:
    def __init__(self, trapos_id="1:a", account_id="local", capabilities=READ):
        self.trapos_id, self.account_id, self.capabilities = trapos_id, account_id, capabilities


class AskRunTests(AskTestsMixin, SynchronousTestCase):
    """Through ``Asks``: the hook acts on the computer's running ask only."""

    def setUp(self):
        super().setUp()
        self.snapshots = FakeSnapshots()
        self.asks = build_asks(
            self.client,
            self.clock,
            self.metrics,
            directory=self.root,
            snapshots=AskSnapshots(self.snapshots, self.clock),
        )

    def test_no_ask_running_no_snapshot(self):
        self.assertIsNone(self.successResultOf(self.asks.before_change(Session())))
        self.assertEqual(self.snapshots.takes, [])

    def test_one_snapshot_per_run_and_the_changed_count_in_the_final_answer(self):
        d = self.ask()
        self.busy()
        waiting = self.asks.before_change(Session())
        self.assertEqual(self.snapshots.takes, [("local", "1:a", "ask")])
        self.snapshots.taking[0].callback({"id": "1"})
        self.successResultOf(waiting)
        self.successResultOf(self.asks.before_change(Session()))
        self.assertEqual(len(self.snapshots.takes), 1)
        # Another computer's token waits on nothing of this run.
        self.successResultOf(self.asks.before_change(Session("2:b")))
        self.snapshots.found = {**NO_CHANGES, "added": [{"path": "/hello.lua"}]}
        self.idle()
        self.assertEqual(self.successResultOf(d), {"sessionId": SES, "text": "", "changed": 1})

        # The next run snapshots again before its own first change.
        second = self.ask(message_id="m2")
        self.busy()
        self.asks.before_change(Session())
        self.assertEqual(len(self.snapshots.takes), 2)
        self.snapshots.taking[1].callback({"id": "2"})
        self.snapshots.found = NO_CHANGES
        self.idle()
        self.assertEqual(self.successResultOf(second), {"sessionId": SES, "text": ""})


class EndpointTests(SynchronousTestCase):
    """``/mcp``: only the changing tools of an ask's token wait on ``before_change``."""

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        self.computer = SandboxComputer.connect(self.registry, "7:base")
        self.waits: list[tuple[str, Deferred]] = []

        def before_change(session):
            d: Deferred = Deferred()
            self.waits.append((session.trapos_id, d))
            return d

        self.endpoint = McpEndpoint(
            self.registry,
            Sandbox(self.registry),
            Metrics(),
            self.clock,
            before_change=before_change,
        )

    def call(self, name, arguments, pin=("local", "7:base")):
        params = {"name": name, "arguments": arguments}
        caller = mcp_caller("local", pin)
        return Deferred.fromCoroutine(self.endpoint._tools_call(params, Call(1), caller))

    def test_a_write_with_an_ask_token_waits_for_the_snapshot(self):
        d = self.call("write_file", {"path": "/x.txt", "content": "x"})
        self.assertEqual([who for who, _ in self.waits], ["7:base"])
        self.assertNotIn("/x.txt", self.computer.files)  # not written before the snapshot
        self.waits[0][1].callback(None)
        result = self.successResultOf(d)
        self.assertFalse(result.get("isError"), result)
        self.assertEqual(self.computer.files["/x.txt"], b"x")

    def test_reading_and_the_operators_calls_do_not_wait(self):
        self.computer.files["/x.txt"] = b"x"
        self.successResultOf(self.call("read_file", {"path": "/x.txt"}))
        self.successResultOf(self.call("list_files", {"path": "/"}))
        # The operator's token (no pin): no ask is involved.
        self.successResultOf(self.call("delete_file", {"path": "/x.txt"}, pin=None))
        self.assertEqual(self.waits, [])
