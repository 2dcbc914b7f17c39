"""
The HTTP side, on the same port as the WebSocket (SPEC §4, §9).

    ``app``        the Klein app, the one router: /, /gateway, /operator, /health, /client,
                   /computers, the section 9 routes, /metrics, /mcp; ``decide``
    ``site``       twisted.web's channel, request and site, bounded for strangers: a
                   request decided at its head, its body capped, a deadline
    ``listener``   what listens in plain mode: the site, with strangers counted
    ``validation`` what a request body may hold: the field checks, each raising
                   ``errors.bad_request`` for a caller's mistake
    ``answers``    JSON answers written onto a request (both body shapes)
    ``streaming``  /execute's NDJSON output stream
    ``operator``   an operator's request to one computer, however it came: who may
                   ask, which account is meant, each outcome's status (an ``Answer``)
    ``opsocket``   ``GET /operator``: one WebSocket carrying many operator requests
    ``listings``   ``watch_computers``' listings, built once per scope per change (debounced)
                   and shared by every watcher of that scope
    ``snapshotcalls`` the snapshot operations, alike on every surface (SPEC §15)
    ``agentcalls`` the agent from the console: an operator's ask on a computer, its own
                   conversation (``ask``, ``ask_cancel``, ``ask_permission``, ``ask_answer``)
    ``filecalls``  a file change from the console as one request and one activity entry
                   (``file_write``, ``file_move``, ``folder_make``)
    ``client``     the Lua files served for the one-line install
    ``console``    the web console's files (``console/``), ``GET /``, with their CSP
"""
