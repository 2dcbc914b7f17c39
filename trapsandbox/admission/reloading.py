"""
The accounts file read again while the gateway runs (SIGHUP; ``trapsandbox-ctl reload``):
the new accounts put in use, and whoever they no longer admit closed.
"""

from __future__ import annotations

from typing import Protocol

import attrs
from twisted.logger import Logger

from trapsandbox.admission import accounts
from trapsandbox.admission.auth import Admission
from trapsandbox.errors import ConfigError

log = Logger()


class Revokes(Protocol):
    def revoke(self, admission: Admission) -> int:
        """Close (4001) the connections ``admission`` no longer admits; how many."""


@attrs.define
class AccountsFile:
    """
    Read ``path`` again into ``admission``.  The computers (``computers``) whose account
    is gone, or whose account's secret changed, are closed with 4001, and so are the
    ``/operator`` sockets (``sockets``) of account tokens no longer admitted; every other
    connection stays.  A bad file keeps the accounts in use and logs one error line.
    """

    admission: Admission
    path: str | None
    computers: Revokes
    sockets: Revokes

    def reload(self) -> bool:
        """Read it again; True if the new accounts are in use."""
        if self.path is None:
            log.info("reload: no accounts file is configured; nothing to reload")
            return False
        try:
            self.admission.reload(accounts.load(self.path))
        except ConfigError as error:
            log.error(
                "accounts not reloaded, keeping the {count} in use: {error}",
                count=len(self.admission.accounts or ()),
                error=str(error),
            )
            return False
        closed = self.computers.revoke(self.admission)
        sockets = self.sockets.revoke(self.admission)
        log.info(
            "accounts reloaded from {path}: {count} accounts; {closed} computers closed{sockets}",
            path=self.path,
            count=len(self.admission.accounts or ()),
            closed=closed,
            sockets=f", {sockets} operator sockets closed" if sockets else "",
        )
        return True
