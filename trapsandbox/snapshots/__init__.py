"""
Snapshots and undo (SPEC §15): the storage layer.  What takes, lists and restores
snapshots on a computer (routes, the ask hook) uses these; nothing here talks to a computer.

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
"""
