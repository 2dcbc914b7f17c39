"""
trapsandbox: a request/reply gateway between CraftOS computers and a sandbox host.

Packages by concern; each package's ``__init__`` is the map of its modules.
Read the list as the architecture: each uses only the ones above it
(tests/unit/test_packaging.py holds it to that), ``tap`` at the bottom builds
everything:

    ``limits``      every limit and default; imports nothing
    ``errors``      the one family of errors: codes, HTTP statuses, ``GatewayError``,
                    the failure bodies, ``ConfigError``; imports nothing
    ``compat``      what both modes need of the libraries' internals (fixes, a raw
                    HTTP response); imports nothing of ours
    ``state``       the state directory (SANDBOX_STATE_DIR) and private files in it
    ``admission``   who gets in: computer secrets, operator tokens, accounts,
                    guessing throttles, trusted proxies, the browser rule
    ``config``      settings from the environment and twistd's options
    ``ops``         operating it: metrics, logs, sd_notify, ``trapsandbox-ctl``
    ``computers``   the computer side: the wire, who is asking, the registry of
                    connected computers, the WebSocket protocol, flow control, and the
                    section 9 operations on a computer (exec, files, screen)
    ``cluster``     several gateway processes sharing computers through Redis
    ``snapshots``   snapshots and undo: the stores (SQLite, or the cluster's Redis),
                    retention, changes and restore plans
    ``opencode``    the opencode side: the probe, and ``sandbox ask``'s sessions
    ``mcp``         the MCP endpoint that lets opencode's agent use the computers
    ``handlers``    what the gateway answers when a computer asks (health, ask, its
                    snapshots): one handler per request type
    ``web``         the HTTP side: the site and its routes, operator requests,
                    ``/operator``, the Lua files served for installs
    ``service``     the gateway's life once built: listening, systemd, the snapshots'
                    store opened, SIGHUP, a graceful stop (``GatewayService``)
    ``fast``        the measured fast paths and every speed patch of a library,
                    installed on purpose by ``tap`` (never on import); nothing imports
                    it but ``tap``, and the plain gateway runs without it
    ``tap``         ``twistd trapsandbox``: options, and the one place objects are built
"""

__version__ = "0.1.0"
