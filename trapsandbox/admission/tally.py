"""
How many of one thing each account holds now: its computers, its ``/operator`` sockets, its
watches. ``take`` one more, ``give_back`` one; ``full`` against a bound. Accounts holding none
are not kept.
"""

from __future__ import annotations


class Tally:
    def __init__(self) -> None:
        self.held: dict[str, int] = {}

    def __getitem__(self, account: str) -> int:
        return self.held.get(account, 0)

    def full(self, account: str, most: int) -> bool:
        return self[account] >= most

    def take(self, account: str) -> None:
        self.held[account] = self[account] + 1

    def give_back(self, account: str) -> None:
        left = self[account] - 1
        if left > 0:
            self.held[account] = left
        else:
            self.held.pop(account, None)
