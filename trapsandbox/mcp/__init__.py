"""
MCP (SPEC §10, §17): opencode's agent, or any MCP client, uses the computers as tools.
Both revisions of docs/mcp.md on one endpoint, one home per concern:

    ``endpoint``       ``POST /mcp`` and ``GET /mcp``: the MCP methods, and each call
                       counted and logged
    ``revision``       which revision a request speaks (2025-xx with initialize, or the
                       stateless 2026-07-28) and that revision's envelope: its _meta and
                       header checks, discovery, resultType and caching hints
    ``jsonrpc``        the transport: JSON-RPC 2.0 over Streamable HTTP (parsing, the
                       -32700/-32600/... errors with the request's id, HTTP statuses,
                       notifications, cancellation)
    ``errors``         the JSON-RPC error codes and ``Invalid``
    ``stream``         an answer as server-sent events
    ``schemas``        the tools as a client lists them: descriptions, input and output schemas
    ``resolve``        which computer a call means (traposId, id or label; an ask's pin)
    ``arguments``      the checks of a tool's arguments
    ``tools``          the tools' bodies: what each asks of the computer and answers
    ``results``        what a call ends as: a CallToolResult, its outcome, ``GatewayError``
    ``resources``      the screen and file resources, read by URI
    ``subscriptions``  who hears when a resource changes (listen, subscribe)
    ``completion``     completion/complete: computers and paths
    ``prompts``        the prompts a player's agent starts from
    ``logs``           the log levels, and each legacy connection's
    ``text``           what a model reads besides a tool's answer: instructions, advice,
                       the computer's refusals and failures
"""
