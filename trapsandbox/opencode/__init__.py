"""
The opencode side (SPEC §3, §11).

    ``probe``        is opencode answering?  (shared, bounded, cached successes)
    ``sse``          server-sent events: bytes in, one JSON object per event out
    ``client``       opencode's HTTP API as ``sandbox ask`` needs it, every call
                     bounded; its failures as an ``opencode_error``
    ``http``         the HTTP client under it: Twisted's Agent, without treq's
                     per-call layers (the probe keeps treq)
    ``events``       the one ``/global/event`` stream of the gateway: dispatch by
                     session, reconnection, silence
    ``agent``        what an ask's agent may do and is told: permission rules, the
                     system note, what a permission request shows the player
    ``tokens``       ask tokens: minted per computer, looked up by ``/mcp``, revoked
    ``directories``  each asking computer's private opencode directory and its
                     MCP block (``opencode.json`` and the instance's server)
    ``instances``    each computer's opencode instance, given back when idle, past
                     a bound (least recently used first) or when forgotten
    ``queue``        asks wait their turn: a bound per opencode server and per
                     account, in order, each told how many are ahead
    ``managed``      the opencode servers the gateway runs itself (OPENCODE_URL
                     unset): started, restarted with backoff, stopped, and why
                     one cannot answer
    ``servers``      several opencode servers: which one a computer's asks go
                     to (a stable ranking), and the health of them all
    ``run``          one ask's life as a state machine: queued, opening, running,
                     waiting for the player, ended; every way it ends and what
                     ending releases, in one place
    ``partials``     opencode's events of an ask's session turned into the
                     player's partials (text batched, tools by call, permission
                     requests with their detail, questions) and its end
    ``replies``      the player's permission replies and answers to opencode,
                     each forgotten only once opencode has it
    ``asks``         ``sandbox ask``'s runs: admission, the opencode server, the
                     conversation kept per computer, cancel, disconnect, stop
    ``front``        the one front end of an ask, the game's ``ask`` request and
                     the console's: activity, partials, the snapshot named
"""
