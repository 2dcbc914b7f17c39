"""
The snapshot before an ask's first change, and the count of what the ask changed (SPEC §15).

    MCP tools/call with an ask's token           (``mcp.endpoint``)
      run_command | run_lua | write_file | delete_file
        -> Asks.before_change(session)            the computer's running ask, if any
        -> AskSnapshots.before_change(run, ...)   the run's first: take(reason "ask");
                                                  later ones, and concurrent ones, wait on it
    the ask ends well ({sessionId, text})
        -> AskSnapshots.closing(run, result)      + changed: N (added + modified + deleted
                                                  since that snapshot), when N > 0

Decisions, so that a snapshot never becomes a new way for an ask to fail:

- A computer that has not allowed ``fs.read`` is not snapshotted, quietly: the tool runs.
- A snapshot that fails (the files exceed SANDBOX_SNAPSHOT_MAX_MB, the computer left, the
  store is down, or it took longer than ``ASK_SNAPSHOT_TIMEOUT``) is logged once for the run,
  with the error's own message (no secrets: paths and sizes at most), and the change goes
  ahead: the player allowed the change, not the snapshot.  Nothing half-made is left: the
  store lists a snapshot only once its commit, the last step, is done.
- The count at the end is best effort too: when it fails the ask ends without the line.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.computers.callers import ASK, Caller, Sender
from trapsandbox.computers.wire import cut
from trapsandbox.snapshots.service import Snapshots

log = Logger()

# The MCP tools that change a computer's files: the first of a run waits for a snapshot.
CHANGING = frozenset({"run_command", "run_lua", "write_file", "delete_file"})


def _share(shared: Deferred) -> Deferred:
    """
    A Deferred that fires with ``shared``'s result (which never fails) and leaves it
    untouched: each waiter may be cancelled (its client gave up) without cancelling the
    snapshot the others wait on.
    """
    waiter: Deferred = Deferred()

    def fire(result: Any) -> Any:
        if not waiter.called:  # a cancelled waiter has been called already
            waiter.callback(result)
        return result

    shared.addCallback(fire)
    return waiter


class AskSnapshots:
    """
    Keeps its state on each ask run (``run.snapshot``: None until the run's first change,
    then a Deferred firing with the snapshot's id, or None when none could be taken).
    """

    def __init__(
        self,
        snapshots: Snapshots,
        clock: IReactorTime,
        timeout: float = limits.ASK_SNAPSHOT_TIMEOUT,
    ) -> None:
        self._snapshots = snapshots
        self._clock = clock
        self._timeout = timeout

    def before_change(self, run: Any, capabilities: frozenset[str]) -> Deferred[None]:
        """Fires when the change may go ahead: once the run's snapshot is taken, or not."""
        if run.snapshot is None:
            if "fs.read" not in capabilities:
                return succeed(None)
            run.snapshot = self._take(run.key)
        return _share(run.snapshot).addCallback(lambda _: None)

    def _take(self, key: tuple[str, str]) -> Deferred[str | None]:
        account, trapos_id = key
        # The agent's, in the computer's activity, as its tool calls are.
        d = self._snapshots.take(Caller(account, trapos_id, Sender(ASK)), "ask")
        d.addTimeout(self._timeout, self._clock)

        def failed(failure: Failure) -> None:
            log.warn(
                "no snapshot before the ask's first change on {traposId} (account {account}): "
                "{why}; the change goes ahead without one",
                traposId=cut(trapos_id),
                account=cut(account),
                why=self._why(failure.value),
            )
            return None

        d.addCallbacks(lambda taken: taken["id"], failed)
        return d

    def closing(self, run: Any, result: dict[str, Any]) -> Deferred[dict[str, Any]]:
        """
        ``result`` (the ask's final answer) with ``changed``: how many files the run
        added, modified or deleted since its snapshot, when any.
        """
        if run.snapshot is None:
            return succeed(result)
        account, trapos_id = run.key

        async def count() -> dict[str, Any]:
            snapshot_id = await _share(run.snapshot)
            if snapshot_id is None:
                return result
            d = self._snapshots.changes(Caller(account, trapos_id, Sender(ASK)), snapshot_id)
            try:
                found = await d.addTimeout(self._timeout, self._clock)
            except Exception as error:
                log.info(
                    "what the ask changed on {traposId} could not be counted: {why}",
                    traposId=cut(trapos_id),
                    why=self._why(error),
                )
                return result
            changed = sum(len(found[kind]) for kind in ("added", "modified", "deleted"))
            return {**result, "changed": changed} if changed else result

        return Deferred.fromCoroutine(count())

    def _why(self, error: BaseException) -> str:
        if isinstance(error, TimeoutError):
            return f"it took longer than {self._timeout:g} s"
        return cut(str(error) or type(error).__name__)
