"""
The opencode side (SPEC §3, §11).

    ``probe``        is opencode answering?  (shared, bounded, cached successes)
    ``sse``          server-sent events: bytes in, one JSON object per event out
    ``client``       opencode's HTTP API as ``sandbox ask`` needs it, every call
                     bounded; its failures as an ``opencode_error``
    ``events``       the one ``/global/event`` stream of the gateway: dispatch by
                     session, reconnection, silence
    ``agent``        what an ask's agent may do and is told: permission rules, the
                     system note, what a permission request shows the player
    ``tokens``       ask tokens: minted per computer, looked up by ``/mcp``, revoked
    ``directories``  each asking computer's private opencode directory and its
                     MCP block (``opencode.json`` and the instance's server)
    ``asks``         ``sandbox ask``'s runs: sessions, prompts, partials,
                     permissions, cancel, what is remembered per computer
"""
