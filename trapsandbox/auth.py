"""
Who may connect: the shared secret a computer presents in ``hello``.

``resolve_account`` is the seam for a future "one account owns many
computers" model; today every good secret belongs to the account "local".
"""

from __future__ import annotations

import hmac

import attrs

from trapsandbox.limits import LOCAL_ACCOUNT


@attrs.frozen
class Authenticator:
    # None: auth is off and any secret is accepted.
    password: str | None = attrs.field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.password is not None

    def resolve_account(self, secret: object) -> str | None:
        """The account ``secret`` belongs to, or None: unauthorized."""
        if self.password is None:
            return LOCAL_ACCOUNT
        if not isinstance(secret, str):
            return None
        if hmac.compare_digest(secret.encode("utf-8"), self.password.encode("utf-8")):
            return LOCAL_ACCOUNT
        return None
