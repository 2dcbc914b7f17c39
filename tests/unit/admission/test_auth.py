"""Admission: computer secrets, operator tokens, the loopback rule, one throttle each."""

from hypothesis import example, given
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import limits
from trapsandbox.admission import auth

HERE = IPv4Address("TCP", "127.0.0.1", 5000)
THERE = IPv4Address("TCP", "203.0.113.9", 5000)


class ComputerTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.admission = auth.Admission(self.clock, password="sesame")

    def test_the_right_secret_is_the_local_account(self):
        self.assertEqual(self.admission.computer("h", "sesame", "7:").account, limits.LOCAL_ACCOUNT)

    def test_a_wrong_or_missing_secret_is_refused(self):
        for secret in ("nope", None, 7, ""):
            refusal = self.admission.computer(f"h{secret}", secret, "7:")
            self.assertEqual(refusal.reason, auth.WRONG, secret)

    def test_no_password_admits_any_secret(self):
        admission = auth.Admission(self.clock)
        self.assertFalse(admission.enabled)
        self.assertEqual(admission.computer("h", None, "7:").account, limits.LOCAL_ACCOUNT)

    def test_a_guessing_address_has_its_wrong_secrets_refused_not_its_right_one(self):
        for _ in range(limits.FREE_FAILURES + 1):
            self.assertEqual(self.admission.computer("h", "nope", "7:").reason, auth.WRONG)
        refusal = self.admission.computer("h", "nope", "7:")
        self.assertEqual(refusal.reason, auth.THROTTLED)
        self.assertGreater(refusal.wait, 0)
        # The right secret is checked first and let in, however blocked its address is.
        self.assertEqual(self.admission.computer("h", "sesame", "7:").account, limits.LOCAL_ACCOUNT)
        # Another address is not affected; the blocked one may try again later.
        self.assertEqual(self.admission.computer("other", "nope", "7:").reason, auth.WRONG)
        self.clock.advance(refusal.wait)
        self.assertEqual(self.admission.computer("h", "nope", "7:").reason, auth.WRONG)


class OperatorTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.admission = auth.Admission(self.clock, admin_token="tok")

    def test_the_token(self):
        self.assertEqual(self.admission.operator(THERE, b"Bearer tok"), auth.ADMIN)
        self.assertEqual(self.admission.operator(THERE, b"bearer tok "), auth.ADMIN)

    def test_missing_and_wrong_tokens(self):
        self.assertEqual(self.admission.operator(THERE, None).reason, auth.MISSING)
        self.assertEqual(self.admission.operator(THERE, b"Bearer x").reason, auth.WRONG)
        self.assertEqual(self.admission.operator(THERE, b"Basic tok").reason, auth.WRONG)

    def test_only_guesses_count_against_the_address(self):
        for _ in range(limits.FREE_FAILURES * 3):
            self.admission.operator(THERE, None)
        self.assertEqual(self.admission.operator(THERE, b"Bearer tok"), auth.ADMIN)
        for _ in range(limits.FREE_FAILURES + 1):
            self.admission.operator(THERE, b"Bearer x")
        self.assertEqual(self.admission.operator(THERE, b"Bearer x").reason, auth.THROTTLED)
        self.assertEqual(self.admission.operator(THERE, None).reason, auth.THROTTLED)
        # The right token is checked first and admitted.
        self.assertEqual(self.admission.operator(THERE, b"Bearer tok"), auth.ADMIN)

    def test_without_a_token_only_loopback_is_served(self):
        admission = auth.Admission(self.clock)
        self.assertEqual(admission.operator(HERE, None), auth.ADMIN)
        self.assertEqual(admission.operator(UNIXAddress(b"/run/s"), None), auth.ADMIN)
        self.assertEqual(admission.operator(THERE, b"Bearer tok").reason, auth.NOT_LOOPBACK)


# One attempt: (address, whether it carries the right credential, seconds waited before it).
ATTEMPTS = st.lists(
    st.tuples(
        st.sampled_from(["10.0.0.1", "10.0.0.2"]), st.booleans(), st.sampled_from([0, 0, 0, 1, 5])
    ),
    max_size=40,
)
# The finding: an address blocked by wrong attempts, then the right credential from it.
BLOCKED_THEN_RIGHT = [("10.0.0.1", False, 0)] * (limits.FREE_FAILURES + 2) + [
    ("10.0.0.1", True, 0),
    ("10.0.0.1", False, 0),
]


class OrderTests(SynchronousTestCase):
    """The credential is checked before the throttle (SPEC §4: a right credential always works)."""

    def check(self, attempts, attempt):
        clock = Clock()
        admission = auth.Admission(clock, password="sesame", admin_token="tok")
        # Wrong attempts from each address since the clock last moved.
        streak: dict[str, int] = {}
        for address, right, wait in attempts:
            if wait:
                clock.advance(wait)
                streak.clear()
            result = attempt(admission, address, right)
            if right:
                # Whatever its address did before.
                self.assertNotIsInstance(result, auth.Refusal)
                continue
            self.assertIsInstance(result, auth.Refusal)
            self.assertIn(result.reason, (auth.WRONG, auth.THROTTLED))
            if streak.get(address, 0) > limits.FREE_FAILURES:
                # Past the free ones, within the block: refused, "try again later".
                self.assertEqual(result.reason, auth.THROTTLED)
            streak[address] = streak.get(address, 0) + 1

    @given(ATTEMPTS)
    @example(BLOCKED_THEN_RIGHT)
    def test_hellos(self, attempts):
        self.check(
            attempts,
            lambda admission, host, right: admission.computer(
                host, "sesame" if right else "guess", "7:"
            ),
        )

    @given(ATTEMPTS)
    @example(BLOCKED_THEN_RIGHT)
    def test_operator_tokens(self, attempts):
        self.check(
            attempts,
            lambda admission, host, right: admission.operator(
                IPv4Address("TCP", host, 1), b"Bearer tok" if right else b"Bearer guess"
            ),
        )


class BearerTokenTests(SynchronousTestCase):
    """The one reader of ``Authorization: Bearer <token>`` (operators', an ask's)."""

    def test_the_scheme_is_case_insensitive(self):
        for header in (b"Bearer tok", b"bearer tok", b"BEARER  tok ", b"bEaReR tok\t"):
            self.assertEqual(auth.bearer_token(header), b"tok", header)

    def test_no_token(self):
        for header in (None, b"", b"Bearer", b"Bearer ", b"Basic dG9rOg==", b"Bearertok", b" tok"):
            self.assertIsNone(auth.bearer_token(header), header)

    def test_operators_are_read_with_it(self):
        admission = auth.Admission(Clock(), admin_token="tok")
        self.assertEqual(admission.operator(THERE, b"bearer tok"), auth.ADMIN)
        self.assertEqual(admission.operator(THERE, b"Basic tok").reason, auth.WRONG)
        self.assertEqual(admission.operator(THERE, None).reason, auth.MISSING)
