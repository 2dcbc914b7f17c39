"""
Snapshots and undo (SPEC §15): taking, comparing and restoring a computer's files
(``service``, the one module here that talks to a computer), and the storage under it.

    ``model``        a snapshot, its files map, its errors, and the checks at the boundary
                     (``/.settings`` refused there: never stored)
    ``retention``    which snapshots a prune drops: keep N per computer, then the oldest
                     until the account is within its quota (pure)
    ``changes``      what to fetch, what changed, a bounded diff, a restore plan (pure)
    ``store``        the interface (``SnapshotStore``): latest, missing, put_content,
                     commit (the one step that makes a snapshot visible, atomic), list,
                     get, content, prune, delete_computer
    ``sqlitestore``  the embedded store: one SQLite file in the state directory, on a
                     thread of its own
    ``redisstore``   the cluster's store: the same Redis, Lua scripts for every change
    ``service``      ``Snapshots``: take, list, changes and restore on a computer, in the
                     order the store expects (what routes, ``trapsandbox-ctl`` and the
                     game's ``sandbox`` commands call)
    ``askhook``      the snapshot before an ask's first change, and what the ask changed
"""
