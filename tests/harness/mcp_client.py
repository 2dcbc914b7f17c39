"""
An independent MCP client for tests: the official MCP Python SDK (PyPI ``mcp``)
over Streamable HTTP.  It is asyncio, so tests run it as a child process:

    python -m tests.harness.mcp_client URL [--token T] STEPS.json

STEPS.json is a list of ``["list_tools"]`` or ``["call", name, arguments]``;
one JSON line a step is printed: ``{"tools": [...]}`` or the call's
``{"isError", "text", "structuredContent"}``, then ``{"done": true, ...}``
with what ``initialize`` agreed on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


async def run(url: str, token: str | None, steps: list) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                for step in steps:
                    if step[0] == "list_tools":
                        listed = await session.list_tools()
                        emit({"tools": [tool.name for tool in listed.tools]})
                    elif step[0] == "call":
                        result = await session.call_tool(step[1], step[2])
                        emit(
                            {
                                "isError": result.isError,
                                "text": "\n".join(
                                    item.text for item in result.content if item.type == "text"
                                ),
                                "structuredContent": result.structuredContent,
                            }
                        )
                    else:
                        raise ValueError(f"unknown step {step!r}")
                emit(
                    {
                        "done": True,
                        "protocolVersion": init.protocolVersion,
                        "server": init.serverInfo.name,
                    }
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("steps")
    parser.add_argument("--token")
    args = parser.parse_args()
    with open(args.steps, encoding="utf-8") as f:
        steps = json.load(f)
    asyncio.run(run(args.url, args.token, steps))


if __name__ == "__main__":
    try:
        main()
    except BaseException as error:  # the test reads why from the output
        import traceback

        traceback.print_exc()
        print(f"mcp_client failed: {error!r}", file=sys.stderr, flush=True)
        sys.exit(1)
