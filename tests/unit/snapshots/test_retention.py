"""Which snapshots a prune drops: keep N per computer, then the oldest past the quota."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots import model
from trapsandbox.snapshots.model import FileEntry
from trapsandbox.snapshots.retention import (
    Held,
    check_fits,
    cost,
    listed_bytes,
    to_drop,
    used_bytes,
)

# What a content hash costs beyond its size.
H = limits.SNAPSHOT_CONTENT_OVERHEAD


@st.composite
def helds(draw):
    count = draw(st.integers(0, 25))
    out = []
    for n in range(count):
        content = draw(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 50), max_size=4))
        listed = draw(st.integers(0, 3 * H))
        out.append(Held(draw(st.sampled_from(["1:", "2:", "3:"])), n + 1, n * 10, content, listed))
    return out


class RetentionTests(SynchronousTestCase):
    @settings(max_examples=60)
    @given(helds(), st.integers(1, 5), st.integers(0, 12 * H))
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

    def test_shared_content_counts_once_and_every_list_counts(self):
        held = [
            Held("1:", 1, 0, {"a": 30}, 100),
            Held("2:", 1, 1, {"a": 30}, 200),
            Held("1:", 2, 2, {"b": 1}, 300),
        ]
        used = 30 + 1 + 2 * H + 600
        self.assertEqual(used_bytes(held), used)
        self.assertEqual(to_drop(held, 10, used), [])
        # The first goes with its list alone; the second takes its list and "a".
        self.assertEqual(to_drop(held, 10, used - 1), held[:1])
        self.assertEqual(to_drop(held, 10, used - 100), held[:1])
        self.assertEqual(to_drop(held, 10, used - 101), held[:2])

    def test_a_list_costs_its_manifest_and_a_hash_its_size_once(self):
        files = {
            "/" + "p" * 200: FileEntry(0, 1, "0" * 64),
            "/q": FileEntry(0, 2, "0" * 64),
            "/r": FileEntry(7, 3, "1" * 64),
        }
        manifest = model.manifest(files)
        # The JSON, byte for byte: {"path":[size,modified,"sha256"],...}, 73 bytes beside
        # each path and its two numbers (one digit each here), a comma between entries.
        self.assertEqual(len(manifest), 2 + 2 + (201 + 73 + 2) + (2 + 73 + 2) + (2 + 73 + 2))
        self.assertEqual(model.from_manifest(manifest), files)
        self.assertEqual(listed_bytes(manifest), len(manifest) + limits.SNAPSHOT_LIST_OVERHEAD)
        self.assertEqual(cost(files), listed_bytes(manifest) + 7 + 2 * H)
        self.assertEqual(check_fits(files, cost(files)), cost(files))
        with self.assertRaises(GatewayError) as raised:
            check_fits(files, cost(files) - 1)
        self.assertEqual(raised.exception.code, errors.TOO_LARGE)
        self.assertIn("nothing was saved", raised.exception.message)


def _beyond_keep(held, keep):
    out = set()
    for trapos_id in {h.trapos_id for h in held}:
        mine = sorted((h for h in held if h.trapos_id == trapos_id), key=lambda h: -h.seq)
        out.update(_key(h) for h in mine[keep:])
    return out


def _key(held):
    return held.trapos_id, held.seq
