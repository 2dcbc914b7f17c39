"""
The HTTP connections of each address that have had no request admitted yet
(SPEC §4 "Nothing is buffered for a stranger").

An HTTP connection counts against its address until a request on it is
admitted (an operator's head accepted, or any other route's head complete):
past ``MAX_UNADMITTED_HTTP_PER_ADDRESS`` such connections, a new one is
answered 429 and closed unread.  Who counts them is what listens: the
first-bytes router (``fast.front``) in fast mode, ``web.listener`` in plain
mode.
"""

from __future__ import annotations

from typing import Any

from trapsandbox import limits
from trapsandbox.admission import auth


class Ticket:
    """One connection's place among its address's strangers, given up once (``admitted``)."""

    __slots__ = ("_host", "_strangers")

    def __init__(self, strangers: Strangers, host: str) -> None:
        self._strangers: Strangers | None = strangers
        self._host = host

    def admitted(self) -> None:
        """The connection's request was admitted, or the connection is gone."""
        strangers, self._strangers = self._strangers, None
        if strangers is not None:
            strangers.leave(self._host)


class Strangers:
    """The HTTP connections of each address that have had no request admitted yet."""

    def __init__(self, limit: int = limits.MAX_UNADMITTED_HTTP_PER_ADDRESS) -> None:
        self.limit = limit
        self.waiting: dict[str, int] = {}

    def enter(self, address: Any) -> Ticket | None:
        """A ``Ticket`` for a new connection from ``address``; None: too many wait."""
        host = auth.host_of(address)
        count = self.waiting.get(host, 0)
        if count >= self.limit:
            return None
        self.waiting[host] = count + 1
        return Ticket(self, host)

    def leave(self, host: str) -> None:
        count = self.waiting.pop(host) - 1
        if count:
            self.waiting[host] = count
