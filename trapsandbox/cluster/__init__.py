"""
Cluster mode (SPEC §13): several gateway processes share computers through Redis.

    ``member``   this process as a member: presence, ownership with fencing epochs,
                 heartbeat, listing, and requests relayed both ways
"""
