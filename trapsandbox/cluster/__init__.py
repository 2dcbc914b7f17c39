"""
Cluster mode (SPEC §13): several gateway processes share computers through Redis.

    ``member``      this process as a member (what ``tap`` builds): composes the
                    parts below, runs the heartbeat and refresh, routes the inbox
    ``redis``       the connections to Redis, reconnecting; every call bounded
    ``ownership``   who holds which computer: claim, refresh, release, with
                    fencing epochs (the Lua scripts); eviction by a newer hello
    ``presence``    the heartbeat, the live processes, ``/health``'s and
                    ``/computers``' cluster-wide view
    ``relay``       requests to a computer another process holds, and serving
                    theirs here, partial responses included
    ``loops``       the periodic work (heartbeat, refresh, the console's listing): a
                    failure logged, never the end of the loop
"""
