"""
Admission: who may connect as a computer, and who may act as an operator.

- A computer presents a secret in ``hello``.  With no password and no
  accounts file configured, auth is off and any secret is accepted as the
  account ``local``.  ``SANDBOX_PASSWORD`` (compared in constant time) is the
  account ``local``; an accounts file's secret (looked up by its SHA-256,
  never compared entry by entry) is its account (SPEC §12).
- An operator (the HTTP operator endpoints) presents
  ``Authorization: Bearer <token>``: ``SANDBOX_ADMIN_TOKEN`` is the admin, who
  sees every account; an account's token (looked up by its SHA-256) sees that
  account's computers only.  With no admin token configured, a client on
  this machine without a token is the admin (behind a trusted proxy, the
  client it forwards decides, not the proxy), unless a browser sent it
  (``browser_refusal``, applied by ``operator.OperatorRequests``; a
  ``/gateway`` upgrade from a web page is refused whatever the auth,
  ``foreign_upgrade``).  ``operator`` answers an
  ``Operator`` (who) or a ``Refusal`` (why not), and ``Operator.account_of``
  is the one place a per-computer request finds the account it means.
  ``bearer_token`` is the one reader of a bearer token.
- ``computer`` answers ``Admitted`` (the account, and the secret's SHA-256,
  computed once and kept by the session) or a ``Refusal``; ``room`` says
  whether the account has room for one more (``max_computers``, ``FULL``).
- ``reload`` replaces the accounts (SIGHUP); ``revoked`` says which connected
  computers the new accounts no longer admit.

A right credential always works (SPEC §4): the secret or token is checked
first, and the right one is admitted at once, whatever its address did
before; a computer's or an operator's address is shared by many (a
Minecraft server's computers, every client of a reverse proxy), and one
stranger's guesses there must not lock them out.  Only wrong ones go to the
throttle of their kind (``throttle``): an address that keeps failing has its
wrong attempts refused for a growing while (``THROTTLED``: ``overloaded``
and 4003 for a hello, 429 with ``Retry-After`` for an operator) and is
warned about once per period.  A check costs one constant-time comparison
and at most one SHA-256, so checking before throttling costs nothing worth
protecting.  What the throttle does not do is stop guessing: a refusal tells
a guesser nothing, but a right guess is admitted even while its address is
blocked, so the secrets' strength is what stops it (accounts' are 128-bit;
the daemon warns at start about a short ``SANDBOX_PASSWORD``).

Whose address it is: ``client_address`` (``proxies``), the peer's own unless
the peer is a trusted reverse proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from trapsandbox import errors
from trapsandbox.admission.accounts import Accounts, sha256_hex
from trapsandbox.admission.proxies import Network, TrustedProxies
from trapsandbox.admission.throttle import FailureThrottle
from trapsandbox.errors import ConfigError, GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT

log = Logger()

# Why an admission was refused.
WRONG = "wrong"  # a secret or token was given and is wrong
MISSING = "missing"  # an operator gave no token
THROTTLED = "throttled"  # wrong, from an address that failed too often: slow down
NOT_LOOPBACK = "not_loopback"  # no admin token is set and the client is not on this machine
BROWSER = "browser"  # a web page (or a DNS rebinding) asking as the loopback admin
FULL = "full"  # a computer's account already has its max_computers connected


@attrs.frozen
class Admitted:
    """
    A computer let in: its account, and the SHA-256 of the secret it gave
    (hashed once, here; ``admits`` compares it after a reload; "" when no
    account's secret was looked up).
    """

    account: str
    credential: str = ""


@attrs.frozen
class Refusal:
    reason: str
    message: str
    # THROTTLED: seconds until the address may try again.
    wait: float = 0.0


# An HTTP-only error code: a traposId held by several accounts, for the admin (409).
# The scope of an account token that asked for another account: nobody's computers.
NOBODY = ""


@attrs.frozen
class Operator:
    """Who an admitted operator is: the admin (``account`` None) or one account."""

    account: str | None = None

    @property
    def admin(self) -> bool:
        return self.account is None

    def scope(self, asked: str | None = None) -> str | None:
        """
        The account whose computers this operator reaches, asking for
        ``asked`` (``?account=``); None: every account (the admin's).  An
        account token asking for another account reaches nobody's, so that
        the answer is the one for a missing computer.
        """
        if self.account is None:
            return asked
        return self.account if asked in (None, self.account) else NOBODY

    def account_of(self, registry: Any, trapos_id: str, asked: str | None = None) -> str:
        """
        The account whose ``trapos_id`` this operator means, or a
        ``GatewayError`` ``ambiguous`` for the admin without ``asked`` when
        several accounts hold it here.  Every operator surface resolves a
        computer's account here: the HTTP routes, the ``/operator`` socket.

        A missing computer and another account's take the same path from
        here (the caller checks the body, then the request finds nothing), so
        their answers cannot differ.
        """
        scope = self.scope(asked)
        if scope is not None:
            # Held here, by another gateway process (cluster mode) or by nobody: the
            # request itself finds out, with the same answer for all but the first.
            return scope
        holders = registry.accounts_holding(trapos_id)
        if len(holders) == 1:
            return holders[0]
        if not holders:
            # Not held here: on another gateway process, ``local``'s (give ?account= for
            # another account's there), or missing.
            return LOCAL_ACCOUNT
        raise GatewayError(
            errors.AMBIGUOUS,
            f"{trapos_id} is connected in {len(holders)} accounts: {', '.join(holders)}; "
            "say which with ?account=NAME",
        )


ADMIN = Operator()


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


def loopback_name(host: str) -> bool:
    """A host name or address that means this machine."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` value (``name[:port]``, ``[v6][:port]``)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def own_origin(origin: str, host: str | None) -> bool:
    """
    Whether ``origin`` is the gateway's own: an http(s) origin whose
    ``host[:port]`` is the request's ``Host`` (a page the gateway served
    itself).  ``null`` (a sandboxed frame, a file) is nobody's own.
    """
    if host is None:
        return False
    scheme, sep, authority = origin.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS or not authority or "/" in authority:
        return False
    default = _DEFAULT_PORTS[scheme]
    authority, host = authority.lower(), host.lower()
    return authority.removesuffix(default) == host.removesuffix(default)


BROWSER_PAGE = "requests from web pages of other origins are refused"
FOREIGN_HOST = (
    "the Host header does not name this machine (DNS rebinding?): without "
    "SANDBOX_ADMIN_TOKEN, operators call the gateway as localhost or 127.0.0.1"
)


def browser_refusal(origin: str | None, host: str | None) -> str | None:
    """
    Why a request admitted as the loopback admin without a token must be
    refused (SPEC §4 "Browsers are not operators"), or None.

    A web page the operator visits can send a request to 127.0.0.1 (it
    carries the page's ``Origin``), and a DNS rebinding makes the page's own
    name point at 127.0.0.1 (the ``Host`` is then that name): either way the
    caller is a browser acting for someone else, and must not be the admin.
    A request with no ``Origin`` (curl, trapsandbox-ctl, an MCP client) or no
    ``Host`` (an HTTP/1.0 tool) is not a browser's.

    This is for callers admitted *because* they are on loopback.  A caller
    with a token is not checked: a page has no token unless it is given one
    (and cannot send ``Authorization`` across origins without a CORS
    preflight, which the gateway never allows), and a remote operator with
    a token reaches the gateway by whatever name it has.
    """
    if origin is not None and not own_origin(origin, host):
        return BROWSER_PAGE
    if host is not None and not loopback_name(_host_name(host.strip())):
        return FOREIGN_HOST
    return None


def foreign_upgrade(origin: str | None, host: str | None) -> bool:
    """
    Whether a ``/gateway`` upgrade comes from a web page (any ``Origin`` but
    the gateway's own): whatever the auth, a page must not connect as, and
    replace, a computer.  CC:Tweaked and CraftOS-PC send no ``Origin``.
    """
    return origin is not None and not own_origin(origin, host)


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
        accounts: Accounts | None = None,
        trusted_proxies: Iterable[Network | str] = (),
    ) -> None:
        # None (and no accounts): auth is off and any secret is accepted.
        self._password = None if password is None else password.encode("utf-8")
        # None: operators are served on loopback only (and account tokens anywhere).
        self._admin_token = None if admin_token is None else admin_token.encode("ascii")
        self.hello_throttle = FailureThrottle(clock) if hello_throttle is None else hello_throttle
        self.token_throttle = FailureThrottle(clock) if token_throttle is None else token_throttle
        self.accounts: Accounts | None = None
        if accounts is not None:
            self.reload(accounts)
        self.trusted_proxies = TrustedProxies(trusted_proxies)

    def client_address(
        self, peer: object, x_forwarded_for: str | None, forwarded: str | None
    ) -> object:
        """
        The address of the client behind the connection's ``peer``, given
        its forwarding headers: every use of a client's address takes it
        from here (``proxies.TrustedProxies.client_address``).
        """
        return self.trusted_proxies.client_address(peer, x_forwarded_for, forwarded)

    def reload(self, accounts: Accounts) -> None:
        """Use ``accounts`` from now on; ``ConfigError`` (and no change) if they clash."""
        if self._password is not None:
            clash = accounts.by_secret.get(sha256_hex(self._password))
            if clash is not None:
                raise ConfigError(f"account {clash.name}'s secret is SANDBOX_PASSWORD")
        if self._admin_token is not None:
            clash = accounts.by_token.get(sha256_hex(self._admin_token))
            if clash is not None:
                raise ConfigError(f"account {clash.name}'s token is SANDBOX_ADMIN_TOKEN")
        self.accounts = accounts

    @property
    def enabled(self) -> bool:
        """Whether computers need a secret."""
        return self._password is not None or self.accounts is not None

    @property
    def operator_token_required(self) -> bool:
        """Whether every operator needs a token (no loopback admin without one)."""
        return self._admin_token is not None

    def account_names(self) -> list[str]:
        """Every account a computer may be admitted to."""
        names = [] if self.accounts is None else list(self.accounts.by_name)
        if self._password is not None or not self.enabled:
            names.insert(0, LOCAL_ACCOUNT)
        return names

    def max_computers(self, account_id: str) -> int | None:
        """How many computers ``account_id`` may have connected at once; None: no limit."""
        account = None if self.accounts is None else self.accounts.by_name.get(account_id)
        return None if account is None else account.max_computers

    def room(self, account_id: str, trapos_id: str, registry: Any) -> Refusal | None:
        """
        Why a computer admitted to ``account_id`` may not connect now (``FULL``:
        its account has its ``max_computers`` connected, SPEC §12), or None.
        A computer replacing its own connection takes no more room.
        """
        most = self.max_computers(account_id)
        if (
            most is None
            or registry.find(account_id, trapos_id) is not None
            or registry.count(account_id) < most
        ):
            return None
        return Refusal(
            FULL,
            f"account {account_id} already has {most} computers connected (its max_computers)",
        )

    def _admitted(self, secret: object) -> Admitted | None:
        """Who ``secret`` admits, or None: unauthorized."""
        if not self.enabled:
            return Admitted(LOCAL_ACCOUNT)
        if not isinstance(secret, str):
            return None
        if self._password is not None and _same(
            secret.encode("utf-8", "surrogatepass"), self._password
        ):
            return Admitted(LOCAL_ACCOUNT)
        if self.accounts is not None:
            credential = sha256_hex(secret)
            account = self.accounts.by_secret.get(credential)
            if account is not None:
                return Admitted(account.name, credential)
        return None

    def admits(self, account_id: str, credential: str) -> bool:
        """
        Whether a computer admitted to ``account_id`` with a secret whose
        SHA-256 is ``credential`` is still admitted (after a reload).
        """
        if account_id == LOCAL_ACCOUNT:
            return True  # the password (or no auth) does not change on reload
        account = None if self.accounts is None else self.accounts.by_name.get(account_id)
        return account is not None and account.secret_sha256 == credential

    def token_still_admits(self, account_id: str, authorization: bytes | None) -> bool:
        """Whether an operator admitted to ``account_id`` with ``authorization`` still is."""
        operator = self._operator_of(bearer_token(authorization))
        return operator is not None and operator.account == account_id

    def revoked(self, sessions: Any) -> list[Any]:
        """The ``sessions`` (with ``account_id`` and ``credential``) no longer admitted."""
        return [s for s in sessions if not self.admits(s.account_id, s.credential)]

    def computer(self, host: str, secret: object, who: str) -> Admitted | Refusal:
        """Who a computer at ``host`` presenting ``secret`` is let in as, or why not."""
        admitted = self._admitted(secret)
        if admitted is not None:
            return admitted
        return self._failed(
            self.hello_throttle,
            host,
            "wrong secrets",
            Refusal(WRONG, "wrong secret: check sandbox.password"),
            lambda: log.warn("hello from {who} refused: wrong secret", who=who),
        )

    def operator(self, address: object, authorization: bytes | None) -> Operator | Refusal:
        """
        Who the HTTP client at ``address`` (``client_address``) is as an
        operator, or why it is not one.
        """
        if self._admin_token is None and self.accounts is None:
            if is_loopback(address):
                return ADMIN
            return Refusal(
                NOT_LOOPBACK,
                "operator endpoints answer only loopback clients while no "
                "SANDBOX_ADMIN_TOKEN is set",
            )
        if not (authorization or b"").partition(b" ")[0]:
            if self._admin_token is None and is_loopback(address):
                return ADMIN
            # No token at all is not a guess: nothing to count against the address,
            # but a blocked one is told to wait, as for a guess.
            wait = self.token_throttle.blocked_for(host_of(address))
            if wait > 0:
                return _throttled("wrong operator tokens", wait)
            return Refusal(MISSING, "a bearer token is required")
        operator = self._operator_of(bearer_token(authorization))
        if operator is not None:
            return operator
        return self._failed(
            self.token_throttle,
            host_of(address),
            "wrong operator tokens",
            Refusal(WRONG, "wrong bearer token"),
        )

    def _operator_of(self, token: bytes | None) -> Operator | None:
        if token is None:
            return None
        if self._admin_token is not None and _same(token, self._admin_token):
            return ADMIN
        if self.accounts is not None:
            account = self.accounts.by_token.get(sha256_hex(token))
            if account is not None:
                return Operator(account.name)
        return None

    def _failed(
        self,
        throttle: FailureThrottle,
        host: str,
        what: str,
        refusal: Refusal,
        first_failures: Callable[[], None] | None = None,
    ) -> Refusal:
        """
        The answer to a wrong credential from ``host``: ``THROTTLED`` while
        the address is blocked (not counted again: its block does not grow
        while it waits), else counted against it and answered ``refusal``.
        """
        wait = throttle.blocked_for(host)
        if wait > 0:
            return _throttled(what, wait)
        block, warn = throttle.failed(host)
        if block == 0:
            if first_failures is not None:
                first_failures()
        elif warn:
            log.warn(
                "{host} keeps sending {what}: refusing them for up to {block:.0f} s at a time",
                host=host,
                what=what,
                block=block,
            )
        return refusal


def _throttled(what: str, wait: float) -> Refusal:
    return Refusal(THROTTLED, f"too many {what} from your address", wait)


def bearer_token(authorization: bytes | None) -> bytes | None:
    """
    The token of an ``Authorization: Bearer <token>`` value, or None (no
    header, another scheme, no token).  The scheme is case-insensitive (RFC
    7235 §2.1); blanks around the token are dropped.  Every bearer token the
    gateway reads (operators', an ask's) is read here.
    """
    scheme, _, token = (authorization or b"").partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token
