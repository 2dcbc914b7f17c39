"""
Who is asking: one value, ``Caller``, that every request to a computer carries
from the surface that took it (an HTTP route, ``/operator``, ``/mcp``, the
computer's own ``ask``) to ``Registry.request``, and across the cluster relay
as data (``Caller.message`` / ``Caller.from_message``).

    Caller(account, trapos_id, sender)

- ``account``: whose computers it may reach: one account's (``LOCAL_ACCOUNT``
  when the gateway has no accounts), or None for the admin's every account;
- ``trapos_id``: the one computer it may reach (an ask's token, or a request
  already aimed at a computer), or None;
- ``sender``: what it is, for the computer's activity (SPEC §14):

    Sender("operator")                     the admin (its token, or loopback without one)
    Sender("operator", NAME)               an account's token
    Sender("agent", NAME?)                 ``/mcp`` with an operator's token (opencode, ...)
    Sender("ask")                          ``/mcp`` with an ask's token (``sandbox ask``)
    Sender("player")                       the computer's own player (its ``ask``)
    Sender("gateway")                      nobody above: the gateway's own work

A request goes to one computer: ``Caller.at`` aims the caller at it, and
refuses (``not_connected``, as for a computer that is not there) one outside
what the caller may reach, so a narrowed value never names another account's
computer.  ``quiet``: the requests are part of one thing the gateway shows as
one activity entry (a snapshot reads every changed file).  Account names are
not secrets; nothing else about the caller is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from trapsandbox.computers import wire

if TYPE_CHECKING:
    from trapsandbox.admission import auth

OPERATOR, AGENT, ASK, PLAYER, GATEWAY = "operator", "agent", "ask", "player", "gateway"
BY = frozenset((OPERATOR, AGENT, ASK, PLAYER, GATEWAY))


@attrs.frozen
class Sender:
    """What sends the requests, as the computer's activity names it."""

    by: str
    account: str | None = None

    def entry(self) -> dict[str, str]:
        """``{"by", "account"?}``: the activity entry's fields (a new dict)."""
        return {"by": self.by} if self.account is None else {"by": self.by, "account": self.account}

    @classmethod
    def of_entry(cls, value: Any) -> Sender:
        """The sender an entry names (a relayed message's); the gateway's for anything else."""
        if isinstance(value, dict) and value.get("by") in BY:
            account = value.get("account")
            return cls(value["by"], account if isinstance(account, str) else None)
        return GATEWAY_SENDER


GATEWAY_SENDER = Sender(GATEWAY)


@attrs.frozen
class Caller:
    """Who is asking: which account's computers, which computer, and what it is."""

    account: str | None
    trapos_id: str | None
    sender: Sender
    quiet: bool = False

    @classmethod
    def of_operator(
        cls, operator: auth.Operator, account: str | None, trapos_id: str, by: str = OPERATOR
    ) -> Caller:
        """``operator`` (``by``: an operator or the agent) asking ``account``'s ``trapos_id``."""
        return cls(account, trapos_id, Sender(by, operator.account))

    @property
    def key(self) -> tuple[str, str]:
        """``(account, traposId)`` of the computer it is aimed at (``at``)."""
        if self.account is None or self.trapos_id is None:
            raise ValueError("a request needs a caller aimed at one computer (Caller.at)")
        return self.account, self.trapos_id

    def at(self, account: str, trapos_id: str) -> Caller:
        """
        The same caller aimed at ``account``'s ``trapos_id``; a ``not_connected``
        ``GatewayError`` when that is outside what it may reach.
        """
        if (self.account is not None and account != self.account) or (
            self.trapos_id is not None and trapos_id != self.trapos_id
        ):
            raise wire.not_connected(trapos_id)
        return attrs.evolve(self, account=account, trapos_id=trapos_id)

    def quietly(self) -> Caller:
        """The same caller, its requests part of one entry its caller shows (``activity.track``)."""
        return attrs.evolve(self, quiet=True)

    def message(self) -> dict[str, Any]:
        """What the cluster relay sends of it (``from_message`` reads it back)."""
        return {"key": list(self.key), "by": self.sender.entry(), "quiet": self.quiet}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Caller:
        """The caller a relayed message carries (``message``), as it was sent."""
        account, trapos_id = message["key"]
        return cls(
            account, trapos_id, Sender.of_entry(message.get("by")), message.get("quiet") is True
        )


def gateway(account: str, trapos_id: str, quiet: bool = False) -> Caller:
    """The gateway itself asking ``account``'s ``trapos_id`` (its own work, no one's request)."""
    return Caller(account, trapos_id, GATEWAY_SENDER, quiet)
