"""
The snapshot operations an operator asks for (SPEC §15), however they arrived: the HTTP
routes (``web.app``) and the same four as request types of ``/operator`` (and of ``POST
/computers/{id}/requests``, whose answers the socket's are; ``operator.OperatorRequests.send``).
The one home of what they answer, so that every surface answers alike::

    type               HTTP route                                      payload
    snapshots          GET  /computers/{id}/snapshots                  -
    snapshot_take      POST /computers/{id}/snapshots                  -
    snapshot_changes   GET  /computers/{id}/snapshots/{snap}/changes   {"snapshot": "3"}
    snapshot_restore   POST /computers/{id}/snapshots/{snap}/restore   {"snapshot": "3"}

Each fires with the answer's fields (``{snapshots}``; ``{id, files, bytes, fetched}``;
``{snapshot, added, modified, deleted, diffs}``; ``{restored, before, deleted, written}``)
or fails with a ``GatewayError`` whose code is the status (``errors.STATUS``).
The account is already resolved (``auth.Operator.account_of``): the store and the registry
answer another account's computer or snapshot exactly like a missing one (§12).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from trapsandbox import errors, limits
from trapsandbox.admission import auth
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots.service import Snapshots
from trapsandbox.snapshots.store import not_found
from trapsandbox.web.validation import short_string

LIST, TAKE, CHANGES, RESTORE = "snapshots", "snapshot_take", "snapshot_changes", "snapshot_restore"
TYPES = frozenset({LIST, TAKE, CHANGES, RESTORE})


class SnapshotCalls:
    """``snapshots``: the gateway's service, or None when it keeps none (every call: 503)."""

    def __init__(self, registry: Registry, snapshots: Snapshots | None) -> None:
        self._registry = registry
        self._snapshots = snapshots

    def _service(self, caller: Caller, snapshot_id: str | None = None) -> Snapshots:
        """
        The service, for a call on ``account``'s computer.  An account's token naming
        another account (``?account=``) reaches nobody's (``auth.NOBODY``, which the store
        refuses as a name): answered as a missing computer, or snapshot, is.
        """
        if self._snapshots is None:
            raise GatewayError(errors.UNAVAILABLE, "snapshots are not set up")
        account, trapos_id = caller.key
        if account == auth.NOBODY:
            if snapshot_id is not None:
                raise not_found(snapshot_id)
            raise wire.not_connected(trapos_id)
        return self._snapshots

    def list(self, caller: Caller) -> Deferred[dict[str, Any]]:
        """``{snapshots}``, newest first; none and not connected answers as a missing computer."""

        async def run() -> dict[str, Any]:
            listed = await self._service(caller).list(caller)
            account, trapos_id = caller.key
            if not listed and not await self._registry.connected(account, trapos_id):
                # Whoever's it is, the answer of a missing computer (§12).
                raise wire.not_connected(trapos_id)
            return {"snapshots": listed}

        return Deferred.fromCoroutine(run())

    def take(self, caller: Caller) -> Deferred[dict[str, Any]]:
        async def run() -> dict[str, Any]:
            return await self._service(caller).take(caller, "manual")

        return Deferred.fromCoroutine(run())

    def changes(self, caller: Caller, snapshot_id: str) -> Deferred[dict[str, Any]]:
        async def run() -> dict[str, Any]:
            return await self._service(caller, snapshot_id).changes(caller, snapshot_id)

        return Deferred.fromCoroutine(run())

    def restore(self, caller: Caller, snapshot_id: str) -> Deferred[dict[str, Any]]:
        """
        Refused at once (403) when the computer has not allowed ``fs.write``: else the
        restore would first take its ``before`` snapshot and then fail at its first write.
        """

        async def run() -> dict[str, Any]:
            service = self._service(caller, snapshot_id)
            session = self._registry.find(*caller.key)
            # (None: not this process's computer; the writes are refused where it is.)
            refusal = None if session is None else session.refusal("write_file", {})
            if refusal is not None:
                raise refusal
            return await service.restore(caller, snapshot_id)

        return Deferred.fromCoroutine(run())

    def request(
        self, kind: str, caller: Caller, payload: dict[str, Any]
    ) -> Deferred[dict[str, Any]]:
        """
        One of ``TYPES`` as a request ``{type, payload}``; raises ``bad_request`` when the
        payload does not name a snapshot where one is needed.
        """
        if kind == LIST:
            return self.list(caller)
        if kind == TAKE:
            return self.take(caller)
        snapshot_id = snapshot_of(payload)
        if kind == CHANGES:
            return self.changes(caller, snapshot_id)
        if kind == RESTORE:
            return self.restore(caller, snapshot_id)
        raise errors.bad_request(f"{wire.cut(kind)} is not a snapshot request")


def snapshot_of(payload: dict[str, Any]) -> str:
    """The snapshot a payload names (``{"snapshot": "3"}``); ``bad_request`` without one."""
    try:
        return short_string(payload, "snapshot", limits.MAX_ID_LENGTH)
    except GatewayError:
        raise errors.bad_request(
            f"payload.snapshot must be a snapshot id, a string of 1 to {limits.MAX_ID_LENGTH} "
            'characters (as "snapshots" lists them)'
        ) from None
