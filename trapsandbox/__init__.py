"""
trapsandbox: a request/reply gateway between CraftOS computers and a sandbox host.

A flat package, one concept per module, as Twisted's own packages are.  Read
the file list as the architecture; arrows are "uses".

The wire and connection side (computers, over one WebSocket each)
    ``limits``     every limit and default; imports nothing
    ``wire``       the four frames, error and close codes, ``GatewayError``
    ``registry``   connected computers (newest wins) and requests to them
                   (Deferreds correlated by messageId, partial responses)
    ``settingsfile`` no file request on a computer's /.settings (its credential);
                   the twin of the Lua client's rule
    ``gateway``    the Autobahn protocol: hello, dispatch, limits, close codes
    ``outbound``   flow control of what one computer is sent
    ``handlers``   computer -> gateway requests: one handler per type
    ``auth``       admission: computer secrets, operator tokens (an ``Operator``:
                   the admin or one account), throttles, reload
    ``accounts``   the accounts file (SPEC §12): hashes looked up by hash, and
                   the edits ``trapsandbox-ctl accounts`` makes
    ``throttle``   the per-address back-off ``auth`` uses

The HTTP side (operators, agents, installs; same port)
    ``front``      what listens: a computer's ``GET /gateway`` and an operator's
                   ``GET /operator`` straight to Autobahn, the rest to ``fasthttp``
    ``fasthttp``   ``POST /computers/{id}/requests`` read off the socket while a
                   connection's requests are its plain case; the rest to the site
    ``web``        the Klein app: /health, /client, /computers, /metrics
    ``operator``   an operator's request to one computer, however it came: who may ask,
                   which account is meant, each outcome's status (an ``Answer``)
    ``opsocket``   ``GET /operator``: one operator WebSocket carrying many requests to
                   computers, answered by id as ``operator`` decides
    ``client``     the Lua files served for the one-line install
    ``sandbox``    the §9 operations on a computer (exec, files, screen)
    ``mcp``        the MCP endpoint that lets opencode use the computers

The opencode side
    ``probe``      is opencode answering? (shared, bounded, cached successes)
    ``opencode``   sessions, prompts and the shared event stream (``ask``)

Operations
    ``config``     settings from the environment and options
    ``state``      the state directory (SANDBOX_STATE_DIR) and the private
                   directories and files in it (ask directories)
    ``tap``        ``twistd trapsandbox``: options and service assembly
    ``ctl``        ``trapsandbox-ctl``, the operator's command line
    ``batch``      ``trapsandbox-ctl batch``: NDJSON requests over one ``/operator``
    ``metrics``    Prometheus metrics on the gateway's own registry
    ``logs``       journald and JSON log observers
    ``systemd``    sd_notify
    ``compat``     where we reach into Autobahn's and Twisted's internals
    ``cluster``    several processes sharing presence through Redis
"""

__version__ = "0.1.0"
