"""
Ask tokens (SPEC §11): the bearer token each asking computer's opencode
instance sends to ``/mcp``, which reaches that computer only.  Minted when a
computer's directory is first given its MCP block, looked up by ``/mcp``
(``scope_of``), revoked when the computer's conversation is forgotten.  Only
a token's SHA-256 is looked up, so no comparison leaks it by timing.
"""

from __future__ import annotations

import hashlib
import secrets

from trapsandbox.admission.auth import bearer_token

Key = tuple[str, str]  # (account, traposId)


def _digest(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


class AskTokens:
    """The ask tokens in force, by computer."""

    def __init__(self) -> None:
        self._scopes: dict[str, Key] = {}  # sha256(token) -> (account, traposId)
        self._token_of: dict[Key, str] = {}

    def scope_of(self, authorization: bytes | None) -> Key | None:
        """The (account, traposId) an ``Authorization`` header's ask token is for, or None."""
        token = bearer_token(authorization)
        return None if token is None else self._scopes.get(_digest(token))

    def token(self, key: Key) -> str:
        """``key``'s token, minted on first use (256 random bits)."""
        token = self._token_of.get(key)
        if token is None:
            token = "ask-" + secrets.token_urlsafe(32)
            self._token_of[key] = token
            self._scopes[_digest(token.encode())] = key
        return token

    def revoke(self, key: Key) -> None:
        """``key``'s token stops working (a later ``token`` mints another)."""
        token = self._token_of.pop(key, None)
        if token is not None:
            self._scopes.pop(_digest(token.encode()), None)
