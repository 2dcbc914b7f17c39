"""
The HTTP side, on the same port as the WebSocket (SPEC §4, §9).

    ``app``        the Klein app: /, /gateway, /operator, /health, /client, /computers,
                   /metrics, and the route classes below; ``decide``
    ``routing``    the one router every route class registers on, and who may call a
                   route (``operators_only``, ``on_computer``)
    ``sandboxroutes`` the routes on one computer: section 9 (exec, files, screen),
                   snapshots, peripherals and turtles
    ``mcproutes``  the routes of /mcp
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
