"""
Admission: who may connect as a computer, and who may act as an operator.

- A computer presents a secret in ``hello``.  With no password configured,
  auth is off and any secret is accepted; otherwise the secret is compared in
  constant time.  ``resolve_account`` maps a good secret to its account: today
  always ``"local"``; this is the seam for "one account owns many computers".
- An operator (the HTTP operator endpoints) presents
  ``Authorization: Bearer <SANDBOX_ADMIN_TOKEN>``; with no token configured
  only clients on this machine are served.

Both checks go through one throttle per kind: an address that keeps failing
is refused for a growing while *without its secret being checked*, so
guessing gains nothing, and it is warned about once per period.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.throttle import FailureThrottle

log = Logger()

# Why an admission was refused.
WRONG = "wrong"  # a secret or token was given and is wrong
MISSING = "missing"  # an operator gave no token
THROTTLED = "throttled"  # the address failed too often: not checked at all
NOT_LOOPBACK = "not_loopback"  # no admin token is set and the client is not on this machine


@attrs.frozen
class Refusal:
    reason: str
    message: str
    # THROTTLED: seconds until the address may try again.
    wait: float = 0.0


def host_of(address: object) -> str:
    """The host part of a Twisted address, as the throttles key it (``unix`` for a socket)."""
    if isinstance(address, UNIXAddress):
        return "unix"
    return str(getattr(address, "host", None) or type(address).__name__)


def is_loopback(address: object) -> bool:
    """A peer on this machine: 127.0.0.0/8, ::1 (also IPv4-mapped), or a unix socket."""
    if isinstance(address, UNIXAddress):
        return True
    if not isinstance(address, IPv4Address | IPv6Address):
        return False
    try:
        ip = ipaddress.ip_address(address.host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _same(given: bytes, expected: bytes) -> bool:
    return hmac.compare_digest(given, expected)


class Admission:
    """The gateway's two doors, each with its own guessing throttle."""

    def __init__(
        self,
        clock: IReactorTime,
        password: str | None = None,
        admin_token: str | None = None,
        hello_throttle: FailureThrottle | None = None,
        token_throttle: FailureThrottle | None = None,
    ) -> None:
        # None: auth is off and any secret is accepted.
        self._password = None if password is None else password.encode("utf-8")
        # None: operators are served on loopback only.
        self._admin_token = None if admin_token is None else admin_token.encode("ascii")
        self.hello_throttle = FailureThrottle(clock) if hello_throttle is None else hello_throttle
        self.token_throttle = FailureThrottle(clock) if token_throttle is None else token_throttle

    @property
    def enabled(self) -> bool:
        """Whether computers need a secret."""
        return self._password is not None

    @property
    def operator_token_required(self) -> bool:
        return self._admin_token is not None

    def resolve_account(self, secret: object) -> str | None:
        """The account ``secret`` belongs to, or None: unauthorized."""
        if self._password is None:
            return LOCAL_ACCOUNT
        if isinstance(secret, str) and _same(secret.encode("utf-8"), self._password):
            return LOCAL_ACCOUNT
        return None

    def computer(self, host: str, secret: object, who: str) -> str | Refusal:
        """The account of a computer at ``host`` presenting ``secret``, or why not."""
        return self._throttled(
            self.hello_throttle,
            host,
            "wrong secrets",
            lambda: self.resolve_account(secret),
            lambda: Refusal(WRONG, "wrong secret: check sandbox.password"),
            lambda: log.warn("hello from {who} refused: wrong secret", who=who),
        )

    def operator(self, address: object, authorization: bytes | None) -> Refusal | None:
        """None if the HTTP client at ``address`` may act as an operator, else why not."""
        if self._admin_token is None:
            if is_loopback(address):
                return None
            return Refusal(
                NOT_LOOPBACK,
                "operator endpoints answer only loopback clients while no "
                "SANDBOX_ADMIN_TOKEN is set",
            )
        scheme, _, token = (authorization or b"").partition(b" ")
        host = host_of(address)
        if not scheme and self.token_throttle.blocked_for(host) == 0:
            # No token at all is not a guess: nothing to count against the address.
            return Refusal(MISSING, "a bearer token is required")
        verdict = self._throttled(
            self.token_throttle,
            host,
            "wrong operator tokens",
            lambda: self._is_admin(scheme, token),
            lambda: Refusal(WRONG, "wrong bearer token"),
        )
        return verdict if isinstance(verdict, Refusal) else None

    def _is_admin(self, scheme: bytes, token: bytes) -> bool | None:
        if scheme.lower() == b"bearer" and _same(token.strip(), self._admin_token):
            return True
        return None

    def _throttled(
        self,
        throttle: FailureThrottle,
        host: str,
        what: str,
        check: Callable[[], Any],
        refusal: Callable[[], Refusal],
        first_failures: Callable[[], None] | None = None,
    ) -> Any:
        """
        ``check()`` unless ``host`` is blocked; a None result counts as a
        failure against it and answers ``refusal()``.
        """
        wait = throttle.blocked_for(host)
        if wait > 0:
            return Refusal(THROTTLED, f"too many {what} from your address", wait)
        result = check()
        if result is not None:
            return result
        block, warn = throttle.failed(host)
        if block == 0:
            if first_failures is not None:
                first_failures()
        elif warn:
            log.warn(
                "{host} keeps sending {what}: refusing it for up to {block:.0f} s at a time",
                host=host,
                what=what,
                block=block,
            )
        return refusal()
