"""
Asks wait their turn (SPEC §11): at most ``per_server`` run at once on one
opencode server and ``per_account`` for one account; more wait in the order
they came.

One opencode process serves every player of a server; without a bound, a
burst of asks makes every one of them slow, and one account's computers could
take the whole of it.  A waiting ask is admitted as soon as both its server
and its account have room, so an account at its own bound never holds up the
others behind it.

A waiting ask is told how many asks wait ahead of it (on its server or of its
account) when it starts waiting, again once that number has halved (157 is told
again at 78, then 39, 19, 9, 4, 2, 1, 0), and again, exactly, every ``repeat``
seconds: the player sees it move, and the computer's idle timer, which any
partial restarts, never ends an ask that is only waiting.  Told at every
change, W waiting asks would cost W messages each time one is admitted
(quadratic in a burst: ~40,000 for 300 computers asking at once); halving, each
is told about log2(W) times (10 for the last of 300).

Entering costs the same whatever waits (the counts of who waits, by server, by
account and by both, are kept); an ask leaving goes through the waiting asks
once.  No timeout runs while an ask waits; the ask's own bound starts once it
is admitted (``asks``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from trapsandbox import limits


@attrs.define(eq=False)
class Ticket:
    """One ask's place: waiting until ``granted`` fires, then running until it leaves."""

    server: str
    account: str
    tell: Callable[[int], None]
    granted: Deferred = attrs.field(factory=Deferred)
    admitted: bool = False
    left: bool = False
    ahead: int | None = None  # how many wait ahead of it now
    told: int | None = None  # ... and what it was last told
    repeat: IDelayedCall | None = None


class AskQueue:
    """The asks running and waiting, by opencode server and by account."""

    def __init__(
        self,
        clock: IReactorTime,
        per_server: int = limits.ASK_MAX_RUNNING,
        per_account: int = limits.ASK_MAX_RUNNING_PER_ACCOUNT,
        repeat: float = limits.ASK_WAITING_REPEAT,
    ) -> None:
        self._clock = clock
        self.per_server = per_server
        self.per_account = per_account
        self._repeat = repeat
        self.running_on: Counter[str] = Counter()
        self.running_of: Counter[str] = Counter()
        self.waiting: list[Ticket] = []
        # How many wait, by server, by account, by both (``enter``'s count of who is ahead).
        self._waiting_on: Counter[str] = Counter()
        self._waiting_of: Counter[str] = Counter()
        self._waiting_both: Counter[tuple[str, str]] = Counter()
        self.stopped = False

    def stop(self) -> None:
        """The gateway stops: no waiting ask is admitted any more (each leaves as it ends)."""
        self.stopped = True

    def enter(self, ticket: Ticket) -> Ticket:
        """
        A new ask's ``ticket``: ``granted`` has fired already if there is room,
        else ``tell(ahead)`` has been called and it fires in its turn (or
        fails with ``CancelledError`` when the ask leaves first).  The caller
        keeps the ticket before it enters: ``tell`` may make the ask leave.
        """
        server, account = ticket.server, ticket.account
        if self.stopped:
            self.waiting.append(ticket)
            self._count_waiting(server, account, 1)
            return ticket
        if (
            self.running_on[server] < self.per_server
            and self.running_of[account] < self.per_account
        ):
            # Every waiting ask has no room (``_admit`` left none that had): it runs first.
            self._run(ticket)
            ticket.granted.callback(None)
            return ticket
        # Behind every waiting ask: nobody else's place changes.
        ticket.ahead = (
            self._waiting_on[server]
            + self._waiting_of[account]
            - self._waiting_both[(server, account)]
        )
        self.waiting.append(ticket)
        self._count_waiting(server, account, 1)
        self._tell(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """The ask ended (or was cancelled, or its computer left): its room goes to the next."""
        if ticket.left:
            return
        ticket.left = True
        self._quiet(ticket)
        if ticket.admitted:
            self.running_on[ticket.server] -= 1
            self.running_of[ticket.account] -= 1
            for counter, name in (
                (self.running_on, ticket.server),
                (self.running_of, ticket.account),
            ):
                if counter[name] <= 0:
                    del counter[name]
        else:
            self.waiting.remove(ticket)
            self._count_waiting(ticket.server, ticket.account, -1)
            ticket.granted.errback(CancelledError("left while waiting"))
        self._admit()

    def _run(self, ticket: Ticket) -> None:
        ticket.admitted = True
        self.running_on[ticket.server] += 1
        self.running_of[ticket.account] += 1

    def _count_waiting(self, server: str, account: str, by: int) -> None:
        self._waiting_on[server] += by
        self._waiting_of[account] += by
        self._waiting_both[(server, account)] += by

    def _admit(self) -> None:
        """Admit, in order, every waiting ask with room; tell the others where they are."""
        if self.stopped or not self.waiting:
            return
        running_on, running_of = self.running_on, self.running_of
        per_server, per_account = self.per_server, self.per_account
        admitted, told, still = [], [], []
        # Who waits, counted as the asks are gone through: how many are ahead of each.
        servers: Counter[str] = Counter()
        accounts: Counter[str] = Counter()
        both: Counter[tuple[str, str]] = Counter()
        for ticket in self.waiting:
            server, account = ticket.server, ticket.account
            if running_on[server] < per_server and running_of[account] < per_account:
                self._run(ticket)
                admitted.append(ticket)
                continue
            still.append(ticket)
            pair = (server, account)
            ahead = servers[server] + accounts[account] - both[pair]
            servers[server] += 1
            accounts[account] += 1
            both[pair] += 1
            if ahead != ticket.ahead:
                ticket.ahead = ahead
                last = ticket.told
                if last is None or ahead <= last // 2:
                    told.append(ticket)
        self.waiting = still
        self._waiting_on, self._waiting_of, self._waiting_both = servers, accounts, both
        # State first, then the callbacks: what they run may enter or leave again.
        for ticket in admitted:
            self._quiet(ticket)
            ticket.granted.callback(None)
        for ticket in told:
            if not ticket.left and not ticket.admitted:
                self._tell(ticket)

    def _tell(self, ticket: Ticket) -> None:
        self._quiet(ticket)
        ticket.repeat = self._clock.callLater(self._repeat, self._tell, ticket)
        ticket.told = ticket.ahead or 0  # set by _admit before any tell
        ticket.tell(ticket.told)

    def _quiet(self, ticket: Ticket) -> None:
        if ticket.repeat is not None and ticket.repeat.active():
            ticket.repeat.cancel()
        ticket.repeat = None
