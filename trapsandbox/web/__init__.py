"""
The HTTP side, on the same port as the WebSocket (SPEC §4, §9).

    ``app``        the site (decides an operator request at its head) and the Klein
                   app: /health, /client, /computers, the section 9 routes, /metrics, /mcp
    ``operator``   an operator's request to one computer, however it came: who may
                   ask, which account is meant, each outcome's status (an ``Answer``)
    ``opsocket``   ``GET /operator``: one WebSocket carrying many operator requests
    ``client``     the Lua files served for the one-line install
"""
