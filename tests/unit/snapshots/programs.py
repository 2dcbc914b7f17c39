"""
Programs of edits, snapshots, restores and prunes, and a model computer to run them on:
what the store tests replay against each store, and the wiring's take and restore, written
with the package's pure functions the way the gateway will use them.
"""

from __future__ import annotations

import hashlib

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from trapsandbox.snapshots import changes

PATHS = ["/a", "/b", "/d", "/d/a", "/d/e/f", "/startup.lua"]
contents = st.sampled_from([b"", b"x", b"hello\n", b"\xff\x00bin", b"y" * 40, b"hello\nworld\n"])
steps = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), contents),
    st.tuples(st.just("delete"), st.sampled_from(PATHS)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restore"), st.integers(0, 5)),
    st.tuples(st.just("prune")),
)
programs = st.lists(steps, min_size=1, max_size=20)


def generate(strategy, count: int) -> list:
    """``count`` examples of ``strategy``, the same on every run (the stores are async)."""
    found: list = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example):
        found.append(example)

    collect()
    return found[:count]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Computer:
    """A computer's files as a dict, with CraftOS's tree rule: a file is never a directory."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.times: dict[str, int] = {}
        self.clock = 0

    def write(self, path: str, data: bytes) -> None:
        for other in list(self.files):
            if other.startswith(path + "/") or path.startswith(other + "/"):
                self.delete(other)
        self.clock += 1
        self.files[path] = data
        self.times[path] = self.clock

    def delete(self, path: str) -> None:
        for other in list(self.files):
            if other == path or other.startswith(path + "/"):
                del self.files[other], self.times[other]

    def listing(self) -> dict[str, tuple[int, int]]:
        return {p: (len(d), self.times[p]) for p, d in self.files.items()}


async def take(store, account: str, trapos_id: str, computer: Computer, reason="manual") -> str:
    """A snapshot as the gateway takes one: only what changed travels."""
    latest = await store.latest(account, trapos_id)
    listing = computer.listing()
    fetched = {p: computer.files[p] for p in changes.to_fetch(latest, listing)}
    hashes = {p: sha(d) for p, d in fetched.items()}
    absent = await store.missing(account, hashes.values())
    for path, data in fetched.items():
        if hashes[path] in absent:
            await store.put_content(account, hashes[path], data)
    files = {
        p: {"size": s, "modified": m, "sha256": hashes[p] if p in hashes else latest[p].sha256}
        for p, (s, m) in listing.items()
    }
    return await store.commit(account, trapos_id, files, reason)


async def restore(store, account: str, trapos_id: str, computer: Computer, snapshot_id: str):
    """
    A restore as the gateway does one: a snapshot of now first, then the plan applied;
    the id of that first snapshot, and the plan.
    """
    now_id = await take(store, account, trapos_id, computer, "restore")
    current = (await store.get(account, trapos_id, now_id)).files
    target = (await store.get(account, trapos_id, snapshot_id)).files
    plan = changes.restore_plan(target, current)
    for path in plan.delete:
        computer.delete(path)
    for path, digest in plan.write:
        computer.write(path, await store.content(account, digest))
    return now_id, plan
