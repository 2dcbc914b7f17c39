"""Which snapshots a prune drops: keep N per computer, then the oldest past the quota."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.snapshots.retention import Held, to_drop, used_bytes


@st.composite
def helds(draw):
    count = draw(st.integers(0, 25))
    out = []
    for n in range(count):
        content = draw(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 50), max_size=4))
        out.append(Held(draw(st.sampled_from(["1:", "2:", "3:"])), n + 1, n * 10, content))
    return out


class RetentionTests(SynchronousTestCase):
    @settings(max_examples=60)
    @given(helds(), st.integers(1, 5), st.integers(0, 200))
    def test_the_kept_are_within_keep_and_quota_and_the_newest_stays(self, held, keep, quota):
        dropped = to_drop(held, keep, quota)
        kept = [h for h in held if h not in dropped]
        for trapos_id in {h.trapos_id for h in held}:
            self.assertLessEqual(len([h for h in kept if h.trapos_id == trapos_id]), keep)
        if held:
            self.assertIn(held[-1], kept)
        if used_bytes(kept) > quota:
            # Past the quota only when the newest alone is.
            self.assertEqual(len(kept), 1)
        # Oldest first: nothing kept is older than a snapshot dropped for the quota.
        for_quota = [h for h in dropped if _key(h) not in _beyond_keep(held, keep)]
        if for_quota:
            newest_dropped = max(h.created for h in for_quota)
            self.assertTrue(all(h.created > newest_dropped for h in kept))

    def test_shared_content_counts_once(self):
        held = [
            Held("1:", 1, 0, {"a": 30}),
            Held("2:", 1, 1, {"a": 30}),
            Held("1:", 2, 2, {"b": 1}),
        ]
        self.assertEqual(used_bytes(held), 31)
        self.assertEqual(to_drop(held, 10, 31), [])
        self.assertEqual(to_drop(held, 10, 30), held[:2])


def _beyond_keep(held, keep):
    out = set()
    for trapos_id in {h.trapos_id for h in held}:
        mine = sorted((h for h in held if h.trapos_id == trapos_id), key=lambda h: -h.seq)
        out.update(_key(h) for h in mine[keep:])
    return out


def _key(held):
    return held.trapos_id, held.seq
