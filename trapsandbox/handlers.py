"""
What the gateway answers when a computer asks: one handler per request type.

    computer_request probe_gateway | health  ->  {sandboxOk, opencodeOk, opencodeDetail?}
    computer_request capabilities {capabilities: [..]}  ->  {capabilities: [..]}
        what the computer's owner allows from now on (``sandbox allow``/``deny``)
    computer_request stopped {stopped, stopMessage?}  ->  {stopped}
        the player stopped the agent there (``sandbox stop``, the stop side's redstone) or
        resumed it (SPEC §16): a running ask ends with ``stopped``, requests are refused
    computer_request ask {prompt, new?, yes?}  ->  partials {type: text_delta | tool |
        permission | question | waiting, ..}, then {sessionId, text}
        (SPEC §11, ``trapsandbox.opencode.asks``; the front end: ``trapsandbox.opencode.front``)
    computer_request cancel {messageId}  ->  {cancelled: bool}: abort that ask
    computer_request ask_permission {permissionId, response: once|always|reject}  ->  {}
    computer_request ask_answer {questionId, answers: [[label, ..], ..] | reject: true}  ->  {}
        the player's answer to the agent's question (SPEC §17)
    computer_request snapshots {}  ->  {snapshots: [{id, created, reason, files, bytes}]}
    computer_request snapshot_changes {snapshot?}  ->  {snapshot, added, modified, deleted,
        diffs}: since ``snapshot``, by default the one taken before the last ask
    computer_request snapshot_restore {snapshot}  ->  {restored, before, deleted, written}
        (SPEC §15: ``sandbox snapshots|changes|undo``; the computer's own account and
        traposId only, with its own consent: fs.read, and fs.write to restore)

A handler takes the computer's ``Session`` and its ``ComputerRequest`` and
returns the answer's payload, or a Deferred that fires with it; a
``GatewayError`` (raised or as a failure) is answered as that error, anything
else as ``internal``.  A streaming handler sends partial responses first,
through ``session.link.send_partial(messageId, type, payload)``.  ``hello``
is not here: it is the connection's own business (``trapsandbox.computers.protocol``).
A new request type is one method here and one entry in ``table``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import PLAYER, Caller, Sender
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.front import AskFront

if TYPE_CHECKING:
    from trapsandbox.computers.protocol import Handler
    from trapsandbox.computers.registry import Registry
    from trapsandbox.computers.session import Session
    from trapsandbox.opencode.asks import Asks
    from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult
    from trapsandbox.snapshots.service import Snapshots

log = Logger()

PLAYER_SENDER = Sender(PLAYER)


class ComputerRequests:
    """The handlers of one gateway, and the table the connections dispatch on."""

    def __init__(
        self,
        probe: OpencodeProbe,
        asks: Asks | None = None,
        snapshots: Snapshots | None = None,
        registry: Registry | None = None,
    ) -> None:
        self._probe = probe
        self._asks = asks
        self._snapshots = snapshots
        # An ask's front end, the console's too (the computer's activity shows its asks).
        self._front = AskFront(asks, registry, snapshots)

    def table(self) -> dict[str, Handler]:
        return {
            "probe_gateway": self.probe_gateway,
            # The first seed's name for it; the answer echoes the type asked.
            "health": self.probe_gateway,
            "capabilities": self.capabilities,
            "stopped": self.stopped,
            "ask": self.ask,
            "cancel": self.cancel,
            "ask_permission": self.ask_permission,
            "ask_answer": self.ask_answer,
            "snapshots": self.snapshots,
            "snapshot_changes": self.snapshot_changes,
            "snapshot_restore": self.snapshot_restore,
        }

    def probe_gateway(self, session: Session, frame: wire.ComputerRequest) -> Deferred | dict:
        result = self._probe.fresh()
        if result is not None:
            return result.payload  # answered at once: no Deferred on the hot path
        return self._probe.check().addCallback(_payload_of)

    def capabilities(self, session: Session, frame: wire.ComputerRequest) -> dict[str, Any]:
        try:
            allowed = wire.decode_capabilities(frame.payload.get("capabilities", []))
        except TypeError:
            raise GatewayError(
                errors.BAD_REQUEST, "capabilities must be a list of strings"
            ) from None
        if session.allow(allowed):
            log.info(
                "{traposId} now allows: {capabilities}",
                traposId=session.trapos_id,
                capabilities=", ".join(sorted(allowed)) or "nothing",
            )
        return {"capabilities": sorted(allowed)}

    def stopped(self, session: Session, frame: wire.ComputerRequest) -> dict[str, Any]:
        try:
            stopped = wire.stop_message(
                session.trapos_id, frame.payload.get("stopped"), frame.payload.get("stopMessage")
            )
        except TypeError as error:
            raise GatewayError(errors.BAD_REQUEST, str(error)) from None
        if session.halt(stopped):
            log.info(
                "{traposId}: the agent is {state} by its player",
                traposId=session.trapos_id,
                state="stopped" if stopped is not None else "resumed",
            )
        if stopped is not None and self._asks is not None:
            self._asks.halt(
                session.account_id, session.trapos_id, GatewayError(errors.STOPPED, stopped)
            )
        return {"stopped": stopped is not None}

    def ask(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        def deliver(partial: dict[str, Any]) -> None:
            session.link.send_partial(frame.message_id, frame.type, partial)

        return self._front.start(session, frame.message_id, frame.payload, PLAYER_SENDER, deliver)

    def cancel(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        messages = frame.payload.get("messageId")
        return self._front.cancel(session.account_id, session.trapos_id, messages)

    def ask_permission(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        return self._front.reply(session.account_id, session.trapos_id, frame.payload)

    def ask_answer(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        return self._front.answer(session.account_id, session.trapos_id, frame.payload)

    # -- Snapshots (SPEC §15): the asking computer's own, with its own consent ---------------

    def _need_snapshots(self, session: Session, *capabilities: str) -> Snapshots:
        for capability in capabilities:
            if capability not in session.capabilities:
                raise wire.not_allowed(session.trapos_id, capability)
        if self._snapshots is None:
            raise GatewayError(errors.UNAVAILABLE, "this gateway keeps no snapshots")
        return self._snapshots

    def snapshots(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        snapshots = self._need_snapshots(session, "fs.read")
        d = snapshots.list(_player(session))
        return d.addCallback(lambda listed: {"snapshots": listed})

    def snapshot_changes(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        snapshots = self._need_snapshots(session, "fs.read")
        caller = _player(session)

        async def run() -> dict[str, Any]:
            snapshot_id = frame.payload.get("snapshot")
            if snapshot_id is None:
                snapshot_id = await _before_last_ask(snapshots, caller)
            return await snapshots.changes(caller, _snapshot_id(snapshot_id))

        return Deferred.fromCoroutine(run())

    def snapshot_restore(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        snapshots = self._need_snapshots(session, "fs.read", "fs.write")
        snapshot_id = _snapshot_id(frame.payload.get("snapshot"))
        return snapshots.restore(_player(session), snapshot_id)


def _player(session: Session) -> Caller:
    """The computer's own player, asking for its own computer."""
    return Caller(session.account_id, session.trapos_id, PLAYER_SENDER)


def _snapshot_id(value: object) -> str:
    if type(value) is not str or not value:
        raise GatewayError(errors.BAD_REQUEST, "snapshot must be a snapshot's id (a string)")
    return value


async def _before_last_ask(snapshots: Snapshots, caller: Caller) -> str:
    """The id of the newest snapshot taken before an ask, or ``not_found`` saying so."""
    for each in await snapshots.list(caller):
        if each["reason"] == "ask":
            return each["id"]
    raise GatewayError(errors.NOT_FOUND, "no ask has changed files on this computer yet")


def _payload_of(result: ProbeResult) -> dict[str, Any]:
    return result.payload
