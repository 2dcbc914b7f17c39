"""
The client's address, when a reverse proxy may stand in front (SPEC §4).

A connection's peer is the client, unless the peer is a proxy listed in
``SANDBOX_TRUSTED_PROXIES``: then the client is the right-most address of
``X-Forwarded-For`` (or, when there is none, of ``Forwarded: for=``) that is
not itself a listed proxy.  Entries left of it were written by whoever sent
the request to the first proxy, so they are never believed; an entry that is
no address (``unknown``, an obfuscated ``_name``, garbage) ends the walk at
the proxy that wrote it.  From a peer that is not listed both headers are
ignored: anyone can send them.

``TrustedProxies.client_address`` is the one place this is decided; every
use of a client's address (the throttles, the loopback admin, the
per-address cap, ``/computers``, the logs) takes its answer.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.logger import Logger

log = Logger()

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# In SANDBOX_TRUSTED_PROXIES: connections on a unix socket come from a proxy.
UNIX = "unix"

# RFC 7239: forwarded-element = pair *( ";" pair ), elements separated by ",";
# a pair is token "=" ( token / quoted-string ).
_PAIR = re.compile(
    r'[ \t]*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)=("(?:[^"\\]|\\.)*"|[!#$%&\'*+.^_`|~0-9A-Za-z:\[\]-]*)'
    r"[ \t]*([;,]|$)"
)
_UNQUOTE = re.compile(r"\\(.)")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _peer_ip(peer: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(peer, IPv4Address | IPv6Address):
        return None
    return _ip(peer.host.split("%", 1)[0])


def _node(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """An address with an optional port (``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``, ``::1``)."""
    text = text.strip()
    port = ""
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return None
        port = port[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text
    ip = _ip(host)
    if ip is None:
        return None
    # An obfuscated port (``_abc``) is no port.
    return ip, int(port) if port.isdigit() and int(port) <= 65535 else 0


def forwarded_for(value: str) -> list[str] | None:
    """
    The ``for=`` of each element of a ``Forwarded`` header, left to right (an
    element without one is ``unknown``); None if the header cannot be read.
    """
    nodes: list[str] = []
    current: str | None = None
    position = 0
    separator = ","
    while position < len(value):
        pair = _PAIR.match(value, position)
        if pair is None:
            return None
        name, found, separator = pair.groups()
        if found.startswith('"'):
            found = _UNQUOTE.sub(r"\1", found[1:-1])
        if name.lower() == "for":
            current = found
        if separator != ";":
            nodes.append("unknown" if current is None else current)
            current = None
        position = pair.end()
    if separator == ";":  # a last element ending in ";"
        nodes.append("unknown" if current is None else current)
    return nodes


class TrustedProxies:
    """The proxies whose forwarding headers are believed (none by default)."""

    def __init__(self, trusted: Iterable[Network | str] = ()) -> None:
        trusted = tuple(trusted)
        self.unix = UNIX in trusted
        self.networks: tuple[Network, ...] = tuple(n for n in trusted if n != UNIX)
        self._warned = False

    def __bool__(self) -> bool:
        return self.unix or bool(self.networks)

    def _trusts(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(ip in network for network in self.networks)

    def _trusts_peer(self, peer: object) -> bool:
        if isinstance(peer, UNIXAddress):
            return self.unix
        ip = _peer_ip(peer)
        return ip is not None and self._trusts(ip)

    def client_address(
        self, peer: object, x_forwarded_for: str | None, forwarded: str | None
    ) -> object:
        """
        The address of the client behind ``peer`` (a Twisted address), given
        the request's ``X-Forwarded-For`` and ``Forwarded`` (each the values
        of all its header lines joined with ``,``, or None): ``peer`` itself
        unless it is a trusted proxy.  A forwarded client is an
        ``IPv4Address``/``IPv6Address`` with port 0 when none was given.
        """
        if x_forwarded_for is None and forwarded is None:
            return peer
        if not self._trusts_peer(peer):
            self._warn_untrusted(peer)
            return peer
        if x_forwarded_for is not None:
            nodes: list[str] | None = x_forwarded_for.split(",")
        else:
            nodes = forwarded_for(forwarded)
            if nodes is None:
                return peer
        client = peer
        for node in reversed(nodes):
            if not node.strip():
                continue  # an empty list element (RFC 9110 §5.6.1)
            found = _node(node)
            if found is None:
                return client  # unknown or obfuscated: the proxy that wrote it is all we know
            ip, port = found
            client = (IPv4Address if ip.version == 4 else IPv6Address)("TCP", str(ip), port)
            if not self._trusts(ip):
                return client
        return client

    def _warn_untrusted(self, peer: object) -> None:
        if self._warned:
            return
        ip = _peer_ip(peer)
        if not (isinstance(peer, UNIXAddress) or (ip is not None and ip.is_loopback)):
            return
        self._warned = True
        log.warn(
            "a request from {peer} on this machine carries X-Forwarded-For or Forwarded: a "
            "reverse proxy seems to be in front, and every client it forwards is taken for "
            "a loopback client. List it in SANDBOX_TRUSTED_PROXIES (e.g. 127.0.0.1) so that "
            "its clients' own addresses are used (said once)",
            peer=describe(peer),
        )


def describe(address: object) -> str:
    """A client address as the logs and ``/computers`` show it (``tcp4:1.2.3.4:5678``)."""
    if isinstance(address, IPv4Address | IPv6Address):
        kind = "tcp4" if isinstance(address, IPv4Address) else "tcp6"
        return f"{kind}:{address.host}:{address.port}" if address.port else f"{kind}:{address.host}"
    if isinstance(address, UNIXAddress):
        name = address.name.decode() if isinstance(address.name, bytes) else address.name
        return f"unix:{name}" if name else "unix"
    return str(address)


def parse(value: str) -> tuple[Network | str, ...]:
    """
    ``SANDBOX_TRUSTED_PROXIES``: comma-separated addresses, CIDRs, or
    ``unix``; raises ``ValueError`` naming the entry that is none of them.
    """
    trusted: list[Network | str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry == UNIX:
            trusted.append(UNIX)
            continue
        try:
            trusted.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an address, a CIDR or {UNIX}") from None
    return tuple(trusted)
