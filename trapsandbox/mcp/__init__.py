"""
MCP (SPEC §10): opencode's agent, or any MCP client, uses the computers as tools.

    ``endpoint``   ``POST /mcp``: the MCP methods (initialize, ping, tools/list,
                   tools/call), and each call counted and logged
    ``jsonrpc``    the transport: JSON-RPC 2.0 over Streamable HTTP (parsing, the
                   -32700/-32600/... errors, HTTP statuses, notifications)
    ``schemas``    the tools as a client lists them: descriptions and JSON Schemas
    ``resolve``    which computer a call means (traposId, id or label; an ask's pin)
    ``arguments``  the checks of a tool's arguments
    ``tools``      the tools' bodies: what each asks of the computer and answers
    ``results``    what a call ends as: a CallToolResult, its outcome, ``ToolError``
    ``text``       what a model reads besides a tool's answer: instructions, advice,
                   the computer's refusals and failures
    ``resources``  a computer's screen and files as resources read by URI (SPEC §17)
    ``stream``     a response as server-sent events (a call's progress)
"""
