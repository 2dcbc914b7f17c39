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
account) when it starts waiting, whenever that number changes while under 10,
or when its leading figure changes (157 is told again at 99, then 89, ..., 9, 8
...), and again, exactly, every ``repeat`` seconds: the player sees it waiting,
and the computer's idle timer, which any partial restarts, never ends an ask
that is only waiting.  Told at every change, W waiting asks would cost W
messages each time one is admitted (quadratic in a burst: ~40,000 for 300
computers asking at once); by figure, each is told a few dozen times at most.
No timeout runs while an ask waits; the ask's own bound starts once it is
admitted (``asks``).
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
        self.waiting.append(ticket)
        self._admit()
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
            ticket.granted.errback(CancelledError("left while waiting"))
        self._admit()

    def _admit(self) -> None:
        """Admit, in order, every waiting ask with room; tell the others where they are."""
        if self.stopped:
            return
        admitted, told = [], []
        servers: Counter[str] = Counter()
        accounts: Counter[str] = Counter()
        both: Counter[tuple[str, str]] = Counter()
        for ticket in list(self.waiting):
            server, account = ticket.server, ticket.account
            if (
                self.running_on[server] < self.per_server
                and self.running_of[account] < self.per_account
            ):
                self.waiting.remove(ticket)
                ticket.admitted = True
                self.running_on[server] += 1
                self.running_of[account] += 1
                admitted.append(ticket)
                continue
            ahead = servers[server] + accounts[account] - both[(server, account)]
            servers[server] += 1
            accounts[account] += 1
            both[(server, account)] += 1
            ticket.ahead = ahead
            if ticket.told is None or _figure(ahead) != _figure(ticket.told):
                told.append(ticket)
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


def _figure(ahead: int) -> int:
    """``ahead`` to its leading figure: 7 is 7, 42 is 40, 157 is 100."""
    step = 10 ** (len(str(ahead)) - 1)
    return ahead // step * step
