"""
Which computer a tool call means (SPEC §10, §11).

The computers a caller may name are its scope's (an account's, or every
account's for the admin: ``auth.Operator.scope``, decided by the route), here
and, in cluster mode, on the other gateway processes; an ask's token reaches
its own computer only (``pinned``).  ``computer`` names one by traposId
(``"7:base"``), bare id (``"7"``) or label (``"base"``); omitted, it means the
only one.  Which account's computer a name means when the admin sees it in
several is the HTTP routes' rule, ``auth.Operator.account_of``.  A name that
means none, or several, is a ``GatewayError`` listing the candidates.
"""

from __future__ import annotations

from typing import Any

import attrs

from trapsandbox import errors
from trapsandbox.admission import auth
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.results import AMBIGUOUS, INVALID_ARGUMENTS


def split(trapos_id: str) -> tuple[str, str]:
    """A traposId's computer id and label."""
    number, _, label = trapos_id.partition(":")
    return number, label


def _sessions(registry: Registry, account_id: str | None) -> list[Session]:
    """The account's computers (None: every account's), by traposId."""
    return sorted(registry.of_account(account_id), key=lambda s: (s.trapos_id, s.account_id))


@attrs.frozen
class Remote:
    """A computer another gateway process holds (cluster mode), as its listing says."""

    trapos_id: str
    account_id: str
    capabilities: frozenset[str]
    version: str | None


def _remote(entry: dict[str, Any]) -> Remote:
    return Remote(
        str(entry.get("traposId")),
        str(entry.get("accountId")),
        frozenset(entry.get("capabilities") or ()),
        entry.get("version"),
    )


async def computers(registry: Registry, caller: Caller) -> list[Any]:
    """
    The computers ``caller``'s tools may name: its account's (every account's for
    the admin) here and, in cluster mode, on the other gateway processes; only the
    asking one for an ask's token (a caller aimed at one computer).
    """
    scope = caller.account
    if caller.trapos_id is not None:
        return [s for s in _sessions(registry, scope) if s.trapos_id == caller.trapos_id]
    found: list[Any] = _sessions(registry, scope)
    listing = getattr(registry.peers, "computers", None)
    if listing is not None:
        others = await listing([])  # the other processes' computers only
        found += [
            _remote(entry)
            for entry in others.get("computers", [])
            if scope is None or entry.get("accountId") == scope
        ]
        found.sort(key=lambda s: (s.trapos_id, s.account_id))
    return found


def several_accounts(sessions: list[Any]) -> bool:
    """Whether names must say the account (the admin sees more than one)."""
    return len({s.account_id for s in sessions}) > 1


def _name(session: Any, every_account: bool) -> str:
    return (
        f"{session.trapos_id} (account {session.account_id})"
        if every_account
        else (session.trapos_id)
    )


@attrs.frozen
class _Holders:
    """The accounts holding each traposId among the computers a caller sees."""

    sessions: list[Any]

    def accounts_holding(self, trapos_id: str) -> list[str]:
        return sorted({s.account_id for s in self.sessions if s.trapos_id == trapos_id})


def resolve(
    registry: Registry,
    computer: object,
    account_id: str | None,
    sessions: list[Any] | None = None,
) -> Session:
    """
    The session ``computer`` names (SPEC §10) among ``account_id``'s computers
    (None: every account's, for the admin) or among ``sessions`` when given,
    or a ``GatewayError`` saying why not.
    """
    if sessions is None:
        sessions = _sessions(registry, account_id)
    every = several_accounts(sessions)
    known = ", ".join(_name(s, every) for s in sessions) or "none"
    if computer is None or computer == "":
        if len(sessions) == 1:
            return sessions[0]
        if not sessions:
            raise GatewayError(
                errors.NOT_CONNECTED,
                "No computer is connected to the gateway. A computer connects once the "
                "trapsandbox client is installed and running on it.",
            )
        raise GatewayError(
            AMBIGUOUS,
            f"{len(sessions)} computers are connected: {known}. Say which one with the "
            "computer argument (a traposId, id or label).",
        )
    if type(computer) is not str:
        raise GatewayError(INVALID_ARGUMENTS, 'computer must be a string, e.g. "7:base" or "7"')
    matches = [s for s in sessions if s.trapos_id == computer]
    if ":" not in computer:
        matches = [s for s in sessions if split(s.trapos_id)[0] == computer]
        if not matches:
            matches = [s for s in sessions if split(s.trapos_id)[1] == computer]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise GatewayError(
            errors.NOT_CONNECTED,
            f'No connected computer is "{wire.cut(computer)}". Connected: {known}. '
            "Call list_computers to see them.",
        )
    named = {s.trapos_id for s in matches}
    if len(named) == 1:
        # One traposId in several accounts (the admin's view): whose is the HTTP rule.
        chosen = [s for s in matches if s.account_id == _account_of(account_id, matches, *named)]
        if len(chosen) == 1:
            return chosen[0]
        hint = "Add ?account=NAME to the MCP URL to use one account's computers."
    else:
        hint = "Give the traposId of the one you mean as computer."
    candidates = ", ".join(_name(s, every) for s in matches)
    raise GatewayError(
        AMBIGUOUS,
        f'"{wire.cut(computer)}" matches {len(matches)} computers: {candidates}. {hint}',
    )


def _account_of(scope: str | None, sessions: list[Any], trapos_id: str) -> str | None:
    """
    The account whose ``trapos_id`` a caller of ``scope`` means, as
    ``auth.Operator.account_of`` decides it among the computers it sees;
    None: it cannot tell.
    """
    try:
        return auth.Operator(scope).account_of(_Holders(sessions), trapos_id)
    except GatewayError:
        return None


def pinned(registry: Registry, scope: tuple[str, str]) -> Session:
    """The asking computer of an ask's token (SPEC §11), connected or not."""
    account_id, trapos_id = scope
    for session in _sessions(registry, account_id):
        if session.trapos_id == trapos_id:
            return session
    raise GatewayError(
        errors.NOT_CONNECTED,
        f"{trapos_id}, the computer you are working for, is not connected any more.",
    )
