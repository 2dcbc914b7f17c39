"""The client behind a reverse proxy: which forwarding headers are believed, and how."""

import ipaddress

from hypothesis import assume, given
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.logcapture import LogCapture
from trapsandbox.admission import proxies
from trapsandbox.admission.proxies import TrustedProxies

PROXY = IPv4Address("TCP", "127.0.0.1", 40000)
STRANGER = IPv4Address("TCP", "198.51.100.7", 40000)


def trusted(*entries):
    return TrustedProxies(proxies.parse(",".join(entries)))


def host(address):
    return getattr(address, "host", address)


class ClientAddressTests(SynchronousTestCase):
    def test_no_headers_is_the_peer(self):
        self.assertIs(trusted("127.0.0.1").client_address(PROXY, None, None), PROXY)

    def test_untrusted_peers_headers_are_ignored(self):
        for proxies_ in (TrustedProxies(), trusted("10.0.0.0/8")):
            for peer in (PROXY, STRANGER):
                self.assertIs(proxies_.client_address(peer, "203.0.113.9", None), peer)
                self.assertIs(proxies_.client_address(peer, None, "for=203.0.113.9"), peer)

    def test_a_trusted_peers_x_forwarded_for_names_the_client(self):
        client = trusted("127.0.0.1").client_address(PROXY, "203.0.113.9", None)
        self.assertEqual(client, IPv4Address("TCP", "203.0.113.9", 0))
        self.assertEqual(proxies.describe(client), "tcp4:203.0.113.9")

    def test_the_right_most_untrusted_entry_wins_spoofed_left_ones_are_ignored(self):
        chain = trusted("127.0.0.1", "10.0.0.0/8")
        # The client wrote "127.0.0.1, 192.0.2.1"; the proxies appended the rest.
        value = "127.0.0.1, 192.0.2.1,203.0.113.9 , 10.1.2.3"
        self.assertEqual(host(chain.client_address(PROXY, value, None)), "203.0.113.9")
        # Several header lines are one list.
        self.assertEqual(host(chain.client_address(PROXY, "1.1.1.1, 10.0.0.1", None)), "1.1.1.1")

    def test_only_proxies_is_the_left_most(self):
        chain = trusted("127.0.0.1", "10.0.0.0/8")
        self.assertEqual(host(chain.client_address(PROXY, "10.0.0.2, 10.0.0.1", None)), "10.0.0.2")

    def test_an_entry_that_is_no_address_stops_at_the_proxy_that_wrote_it(self):
        chain = trusted("127.0.0.1", "10.0.0.0/8")
        self.assertIs(chain.client_address(PROXY, "unknown", None), PROXY)
        self.assertIs(chain.client_address(PROXY, "1.2.3.4, garbage", None), PROXY)
        client = chain.client_address(PROXY, "1.2.3.4, _hidden, 10.0.0.5", None)
        self.assertEqual(host(client), "10.0.0.5")

    def test_ports_and_ipv6_in_x_forwarded_for(self):
        proxy = trusted("127.0.0.1")
        self.assertEqual(
            proxy.client_address(PROXY, "203.0.113.9:5555", None),
            IPv4Address("TCP", "203.0.113.9", 5555),
        )
        self.assertEqual(
            proxy.client_address(PROXY, "2001:db8::7", None), IPv6Address("TCP", "2001:db8::7", 0)
        )
        self.assertEqual(
            proxy.client_address(PROXY, "[2001:db8::7]:80", None),
            IPv6Address("TCP", "2001:db8::7", 80),
        )
        # An IPv4-mapped address is the IPv4 one.
        self.assertEqual(
            host(proxy.client_address(PROXY, "::ffff:203.0.113.9", None)), "203.0.113.9"
        )

    def test_forwarded(self):
        proxy = trusted("127.0.0.1")
        cases = {
            "for=203.0.113.9": "203.0.113.9",
            'for="[2001:db8::7]:4711";proto=https': "2001:db8::7",
            'For="[::1]:80"': "::1",
            "for=192.0.2.1, for=203.0.113.9;by=127.0.0.1": "203.0.113.9",
            "proto=http;for=203.0.113.9;": "203.0.113.9",
            'for=127.0.0.1, for="203.0.113.9:99"': "203.0.113.9",
        }
        for value, expected in cases.items():
            self.assertEqual(host(proxy.client_address(PROXY, None, value)), expected, value)

    def test_forwarded_unknown_obfuscated_or_unreadable_is_the_proxy(self):
        proxy = trusted("127.0.0.1")
        for value in ("for=unknown", "for=_gazonk", "by=1.2.3.4", "for=1.2.3.4 junk", 'for="oops'):
            self.assertIs(proxy.client_address(PROXY, None, value), PROXY, value)
        self.assertEqual(
            host(proxy.client_address(PROXY, None, 'for=203.0.113.9, for="_hidden"')), "127.0.0.1"
        )

    def test_x_forwarded_for_comes_before_forwarded(self):
        proxy = trusted("127.0.0.1")
        client = proxy.client_address(PROXY, "203.0.113.9", "for=192.0.2.1")
        self.assertEqual(host(client), "203.0.113.9")

    def test_a_unix_socket_is_a_proxy_only_when_listed(self):
        peer = UNIXAddress(b"/run/trapsandbox/gw.sock")
        self.assertIs(TrustedProxies().client_address(peer, "203.0.113.9", None), peer)
        self.assertEqual(
            host(trusted("unix").client_address(peer, "203.0.113.9", None)), "203.0.113.9"
        )

    def test_a_loopback_peer_with_forwarding_headers_and_no_trust_is_warned_about_once(self):
        logs = LogCapture(self)
        untrusting = TrustedProxies()
        untrusting.client_address(STRANGER, "203.0.113.9", None)
        self.assertEqual(logs.events, [])
        for _ in range(3):
            self.assertIs(untrusting.client_address(PROXY, "203.0.113.9", None), PROXY)
        [warning] = logs.texts()
        self.assertIn("SANDBOX_TRUSTED_PROXIES", warning)

    @given(
        st.lists(st.ip_addresses(), max_size=6),
        st.ip_addresses(),
        st.lists(st.ip_addresses(v=4, network="10.0.0.0/8"), max_size=3),
    )
    def test_whatever_the_client_writes_the_last_untrusted_hop_is_the_client(
        self, written, client, hops
    ):
        # The client writes anything; the first proxy appends the client's real
        # address, the trusted proxies after it their own peers.
        chain = trusted("127.0.0.1", "10.0.0.0/8")
        value = ", ".join(str(ip) for ip in [*written, client, *hops])
        found = chain.client_address(PROXY, value, None)
        real = client.ipv4_mapped if getattr(client, "ipv4_mapped", None) else client
        # A "client" that is itself a trusted proxy is not the case drawn for.
        assume(not any(real in network for network in chain.networks))
        self.assertEqual(ipaddress.ip_address(host(found)), real)


class ParseTests(SynchronousTestCase):
    def test_addresses_networks_and_unix(self):
        self.assertEqual(
            proxies.parse(" 127.0.0.1, 10.0.0.0/8,::1 ,unix,"),
            (
                ipaddress.ip_network("127.0.0.1/32"),
                ipaddress.ip_network("10.0.0.0/8"),
                ipaddress.ip_network("::1/128"),
                "unix",
            ),
        )
        self.assertEqual(proxies.parse(""), ())

    def test_bad_entries_are_named(self):
        for value, entry in (("localhost", "localhost"), ("10.0.0.1, 300.1.1.1", "300.1.1.1")):
            with self.assertRaises(ValueError) as caught:
                proxies.parse(value)
            self.assertIn(repr(entry), str(caught.exception))
