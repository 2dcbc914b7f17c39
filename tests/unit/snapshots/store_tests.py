"""
The tests every snapshot store passes, against a real one: mixed into a trial TestCase
that provides ``open_store(**settings)`` and ``reopen(store)``.
"""

from __future__ import annotations

from tests.unit.snapshots.programs import Computer, generate, programs, restore, sha, take
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots import changes, model, retention
from trapsandbox.snapshots.model import MissingContent, NotFound

A, B = "alice", "bob"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def entry(data: bytes, modified: int = 1) -> dict:
    return {"size": len(data), "modified": modified, "sha256": sha(data)}


class StoreTests:
    # How many programs the property replays (the Redis backend asks for fewer).
    program_examples = 40

    async def store(self, **settings):
        self.clock = Clock()
        settings.setdefault("now", self.clock)
        return await self.open_store(**settings)

    async def reopen(self, store):
        """``store`` closed and opened again with the settings it had (``open_store``'s)."""
        await store.close()
        return await self.open_store(**self._settings)

    async def put(self, store, account, *datas: bytes) -> None:
        for data in datas:
            await store.put_content(account, sha(data), data)

    async def failure(self, d, kind=GatewayError):
        try:
            await d
        except kind as error:
            return error
        raise AssertionError(f"expected {kind.__name__}")

    # -- Taking and reading --------------------------------------------------------------

    async def test_a_committed_snapshot_is_listed_got_and_its_content_read(self):
        store = await self.store()
        await self.put(store, A, b"print('hi')", b"")
        files = {"/startup.lua": entry(b"print('hi')", 5), "/empty": entry(b"", 6)}
        self.assertEqual(await store.commit(A, "1:", files, "ask"), "1")
        [summary] = await store.list(A, "1:")
        self.assertEqual(
            summary.to_json(),
            {
                "id": "1",
                "account": A,
                "traposId": "1:",
                "created": int(self.clock.now * 1000),
                "reason": "ask",
                "files": 2,
                "bytes": 11,
            },
        )
        snapshot = await store.get(A, "1:", "1")
        self.assertEqual({p: e.to_json() for p, e in snapshot.files.items()}, files)
        self.assertEqual(await store.latest(A, "1:"), snapshot.files)
        self.assertEqual(await store.content(A, sha(b"print('hi')")), b"print('hi')")
        self.assertEqual(await store.content(A, sha(b"")), b"")

    async def test_ids_count_per_computer_and_the_list_is_newest_first(self):
        store = await self.store()
        await self.put(store, A, b"x")
        for trapos_id in ("1:", "2:", "1:", "1:"):
            self.clock.now += 1
            await store.commit(A, trapos_id, {"/x": entry(b"x")}, "manual")
        self.assertEqual([s.id for s in await store.list(A, "1:")], ["3", "2", "1"])
        self.assertEqual([s.id for s in await store.list(A, "2:")], ["1"])
        self.assertEqual(await store.list(A, "3:"), [])
        self.assertEqual(await store.latest(A, "3:"), {})

    async def test_missing_names_only_what_is_not_stored(self):
        store = await self.store()
        await self.put(store, A, b"held")
        self.assertEqual(await store.missing(A, [sha(b"held"), sha(b"not")]), {sha(b"not")})
        self.assertEqual(await store.missing(A, []), set())

    async def test_content_under_the_wrong_hash_is_refused(self):
        store = await self.store()
        error = await self.failure(store.put_content(A, sha(b"one"), b"two"))
        self.assertEqual(error.code, errors.BAD_REQUEST)
        self.assertEqual(
            await store.missing(A, [sha(b"one"), sha(b"two")]), {sha(b"one"), sha(b"two")}
        )

    async def test_commit_refuses_missing_content_and_lists_nothing(self):
        store = await self.store()
        await self.put(store, A, b"here")
        files = {"/here": entry(b"here"), "/gone": entry(b"gone")}
        error = await self.failure(store.commit(A, "1:", files, "ask"), MissingContent)
        self.assertEqual(error.hashes, [sha(b"gone")])
        self.assertEqual(await store.list(A, "1:"), [])
        self.assertEqual(await store.latest(A, "1:"), {})
        # Nothing half-done either: the next snapshot is the first.
        await self.put(store, A, b"gone")
        self.assertEqual(await store.commit(A, "1:", files, "ask"), "1")

    async def test_the_settings_file_is_never_stored(self):
        store = await self.store()
        await self.put(store, A, b"pw")
        for path in ("/.settings", "/.SETTINGS", "//.settings", "/.settings.", "/x/../.settings"):
            files = {"/ok": entry(b"pw"), path: entry(b"pw")}
            error = await self.failure(store.commit(A, "1:", files, "manual"))
            self.assertEqual(error.code, errors.FORBIDDEN, path)
        self.assertEqual(await store.list(A, "1:"), [])

    async def test_bad_arguments_are_clear_errors(self):
        store = await self.store()
        calls = [
            store.list("", "1:"),
            store.list(A, "x" * (limits.MAX_ID_LENGTH + 1)),
            store.commit(A, "1:", {}, "because"),
            store.commit(A, "1:", {"relative": entry(b"")}, "ask"),
            store.commit(A, "1:", {"/x": {"size": -1, "modified": 0, "sha256": sha(b"")}}, "ask"),
            store.commit(A, "1:", [], "ask"),
            store.missing(A, ["ABC"]),
            store.content(A, "nothex"),
        ]
        for d in calls:
            self.assertEqual((await self.failure(d)).code, errors.BAD_REQUEST)
        big = {"/big": {"size": limits.SNAPSHOT_MAX_BYTES + 1, "modified": 0, "sha256": sha(b"")}}
        self.assertEqual(
            (await self.failure(store.commit(A, "1:", big, "ask"))).code, errors.TOO_LARGE
        )

    async def test_unknown_and_malformed_ids_answer_not_found(self):
        store = await self.store()
        await self.put(store, A, b"x")
        await store.commit(A, "1:", {"/x": entry(b"x")}, "manual")
        for snapshot_id in ("2", "0", "01", "abc", "", "1 ", "-1", "١"):
            error = await self.failure(store.get(A, "1:", snapshot_id), NotFound)
            self.assertEqual(error.code, errors.NOT_FOUND)
        await self.failure(store.get(A, "2:", "1"), NotFound)

    # -- Accounts ------------------------------------------------------------------------

    async def test_another_accounts_snapshot_and_content_answer_like_missing_ones(self):
        store = await self.store()
        await self.put(store, A, b"secret")
        await store.commit(A, "1:", {"/s": entry(b"secret")}, "ask")
        theirs = await self.failure(store.get(B, "1:", "1"), NotFound)
        none = await self.failure(store.get(B, "1:", "2"), NotFound)
        self.assertEqual(theirs.code, none.code)
        self.assertEqual(theirs.message.replace("1", "N"), none.message.replace("2", "N"))
        self.assertEqual(await store.list(B, "1:"), [])
        self.assertEqual(await store.latest(B, "1:"), {})
        await self.failure(store.content(B, sha(b"secret")), NotFound)
        self.assertEqual(await store.missing(B, [sha(b"secret")]), {sha(b"secret")})
        # Nor can B commit a snapshot over A's content.
        await self.failure(store.commit(B, "1:", {"/s": entry(b"secret")}, "ask"), MissingContent)
        self.clock.now += 3600
        await store.prune(B)
        self.assertEqual(len(await store.list(A, "1:")), 1)
        self.assertEqual(await store.content(A, sha(b"secret")), b"secret")

    # -- Lasting -------------------------------------------------------------------------

    async def test_a_reopened_store_keeps_its_snapshots(self):
        store = await self.store()
        await self.put(store, A, b"kept", b"\x00\xffbinary")
        files = {"/k": entry(b"kept"), "/bin": entry(b"\x00\xffbinary")}
        await store.commit(A, "1:", files, "manual")
        listed = await store.list(A, "1:")
        store = await self.reopen(store)
        self.assertEqual(await store.list(A, "1:"), listed)
        kept = (await store.get(A, "1:", "1")).files
        self.assertEqual({p: e.to_json() for p, e in kept.items()}, files)
        self.assertEqual(await store.content(A, sha(b"\x00\xffbinary")), b"\x00\xffbinary")
        self.assertEqual(await store.commit(A, "1:", files, "manual"), "2")

    # -- Pruning -------------------------------------------------------------------------

    async def test_prune_keeps_the_newest_per_computer_and_removes_what_only_they_used(self):
        store = await self.store(keep=2, grace=60)
        for n in range(4):
            data = b"v%d" % n
            await self.put(store, A, data, b"shared")
            self.clock.now += 1
            await store.commit(A, "1:", {"/f": entry(data), "/s": entry(b"shared")}, "ask")
        await self.put(store, A, b"other")
        await store.commit(A, "2:", {"/o": entry(b"other")}, "ask")
        self.clock.now += 61
        pruned = await store.prune(A)
        self.assertEqual(sorted(pruned.snapshots), [("1:", "1"), ("1:", "2")])
        self.assertEqual((pruned.content, pruned.content_bytes), (2, 4))
        self.assertEqual([s.id for s in await store.list(A, "1:")], ["4", "3"])
        self.assertEqual(len(await store.list(A, "2:")), 1)
        self.assertEqual(
            await store.missing(
                A, [sha(b"v0"), sha(b"v1"), sha(b"v2"), sha(b"v3"), sha(b"shared")]
            ),
            {sha(b"v0"), sha(b"v1")},
        )
        self.assertEqual((await store.prune(A)).snapshots, ())

    async def test_prune_drops_the_oldest_past_the_quota_but_never_the_newest(self):
        one = retention.cost(model.check_files({"/f": entry(b"A" * 20)}, 100))
        store = await self.store(quota=one + one // 2, grace=0)
        for n, trapos_id in enumerate(["1:", "2:", "1:"]):
            data = bytes([65 + n]) * 20
            await self.put(store, A, data)
            self.clock.now += 1
            await store.commit(A, trapos_id, {"/f": entry(data)}, "ask")
        pruned = await store.prune(A)
        self.assertEqual(pruned.snapshots, (("1:", "1"), ("2:", "1")))
        self.assertEqual([s.id for s in await store.list(A, "1:")], ["2"])
        self.assertEqual(await store.list(A, "2:"), [])
        # Alone over a quota lowered since it was taken, the account's newest stays.
        await store.close()
        store = await self.open_store(quota=one // 2, grace=0, now=self.clock)
        self.assertEqual((await store.prune(A)).snapshots, ())
        self.assertEqual([s.id for s in await store.list(A, "1:")], ["2"])

    async def test_file_lists_count_against_the_quota_across_an_accounts_computers(self):
        """
        Issue 43, small: empty files with long paths cost no content, but their lists are
        stored; across several traposIds of one account the lists kept stay within the
        quota, the oldest pruned first, and a new traposId does not escape it.
        """
        quota = 20_000
        store = await self.store(quota=quota, grace=0)
        await self.put(store, A, b"")
        files = {f"/{'d' * 190}/{n:04d}": entry(b"") for n in range(20)}
        path_bytes = sum(len(p) for p in files)  # 3,900: a lower bound of what a list keeps
        taken = []
        for n in range(12):
            trapos_id = f"{n % 6}:"  # a new computer each time for six, then again
            self.clock.now += 1
            taken.append((trapos_id, await store.commit(A, trapos_id, files, "ask")))
            await store.prune(A)
            kept = [(t, s.id) for t in {t for t, _ in taken} for s in await store.list(A, t)]
            self.assertLessEqual(len(kept) * path_bytes, quota, (n, kept))
            # Oldest first: what is kept is the newest taken, the one just taken among them.
            self.assertEqual(sorted(kept), sorted(taken[-len(kept) :]), n)
        self.assertGreaterEqual(len(kept), 2)

    async def test_a_snapshot_whose_own_list_passes_the_quota_is_refused_not_saved(self):
        store = await self.store(quota=2_000)
        await self.put(store, A, b"", b"x")
        await store.commit(A, "1:", {"/x": entry(b"x")}, "ask")
        files = {f"/{'p' * 100}{n}": entry(b"") for n in range(20)}  # 2,000+ bytes of paths
        error = await self.failure(store.commit(A, "2:", files, "ask"))
        self.assertEqual(error.code, errors.TOO_LARGE)
        self.assertIn("SANDBOX_SNAPSHOT_QUOTA_MB", error.message)
        self.assertIn("nothing was saved", error.message)
        self.assertEqual(await store.list(A, "2:"), [])
        self.assertEqual(await store.latest(A, "2:"), {})
        # The account's other snapshots are untouched, and the next id is the first.
        self.assertEqual(len(await store.list(A, "1:")), 1)
        self.assertEqual(await store.commit(A, "2:", {"/x": entry(b"x")}, "ask"), "1")

    async def test_content_being_committed_survives_a_prune_within_the_grace(self):
        store = await self.store(grace=60)
        await self.put(store, A, b"uploaded")
        self.clock.now += 50
        await store.prune(A)
        # A snapshot checking what is held touches it: 50 + 50 s since its upload.
        self.assertEqual(await store.missing(A, [sha(b"uploaded")]), set())
        self.clock.now += 50
        await store.prune(A)
        await store.commit(A, "1:", {"/u": entry(b"uploaded")}, "ask")
        # Never committed and untouched past the grace: swept.
        await self.put(store, A, b"orphan")
        self.clock.now += 61
        pruned = await store.prune(A)
        self.assertEqual((pruned.content, pruned.content_bytes), (1, 6))
        self.assertEqual(
            await store.missing(A, [sha(b"orphan"), sha(b"uploaded")]), {sha(b"orphan")}
        )

    async def test_delete_computer_drops_its_snapshots_and_then_its_content(self):
        store = await self.store(grace=0)
        await self.put(store, A, b"one", b"two")
        await store.commit(A, "1:", {"/f": entry(b"one")}, "ask")
        await store.commit(A, "1:", {"/f": entry(b"one")}, "ask")
        await store.commit(A, "2:", {"/f": entry(b"two")}, "ask")
        self.assertEqual(await store.delete_computer(A, "1:"), 2)
        self.assertEqual(await store.list(A, "1:"), [])
        await store.prune(A)
        self.assertEqual(await store.missing(A, [sha(b"one"), sha(b"two")]), {sha(b"one")})
        self.assertEqual(await store.commit(A, "1:", {"/f": entry(b"two")}, "ask"), "3")

    # -- The property --------------------------------------------------------------------

    async def test_any_program_restores_exactly_the_snapshot_and_prunes_keep_content(self):
        """
        Edits, snapshots, restores and prunes in any order, on the model computer: a restore
        gives back exactly the files of the snapshot restored (and no changes are left to
        see), and after every prune each listed snapshot's content is all there.
        """
        store = await self.store(keep=3, quota=6_000, grace=0)
        for number, program in enumerate(generate(programs, self.program_examples)):
            account, trapos_id = f"acct{number}", f"{number}:"
            computer = Computer()
            taken: dict[str, dict[str, bytes]] = {}
            for step in program:
                if step[0] == "write":
                    computer.write(step[1], step[2])
                elif step[0] == "delete":
                    computer.delete(step[1])
                elif step[0] == "snapshot":
                    self.clock.now += 1
                    snapshot_id = await take(store, account, trapos_id, computer)
                    taken[snapshot_id] = dict(computer.files)
                elif step[0] == "restore":
                    listed = [s.id for s in await store.list(account, trapos_id)]
                    if not listed:
                        continue
                    snapshot_id = listed[step[1] % len(listed)]
                    self.clock.now += 1
                    before = dict(computer.files)
                    now_id, _ = await restore(store, account, trapos_id, computer, snapshot_id)
                    taken[now_id] = before
                    self.assertEqual(computer.files, taken[snapshot_id], (program, step))
                    target = (await store.get(account, trapos_id, snapshot_id)).files
                    listing = computer.listing()
                    fetched = changes.to_fetch(target, listing)
                    hashes = {p: sha(computer.files[p]) for p in fetched}
                    self.assertEqual(len(changes.changes(target, listing, hashes)), 0)
                else:
                    await store.prune(account)
                    for summary in await store.list(account, trapos_id):
                        files = (await store.get(account, trapos_id, summary.id)).files
                        for path, data in taken[summary.id].items():
                            self.assertEqual(files[path].sha256, sha(data))
                            self.assertEqual(await store.content(account, sha(data)), data)
            # Everything it listed was taken by it; ids never reused.
            listed = [s.id for s in await store.list(account, trapos_id)]
            self.assertLessEqual(set(listed), set(taken))
