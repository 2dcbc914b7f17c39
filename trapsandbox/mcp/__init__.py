"""
MCP (SPEC §10): opencode's agent, or any MCP client, uses the computers as tools.

    ``endpoint``  ``POST /mcp``: JSON-RPC over Streamable HTTP, the tools, which
                  computer a call means, and the text a model reads
"""
