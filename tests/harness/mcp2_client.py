"""
A 2026-07-28 MCP client for tests: the official MCP Python SDK 2.x (PyPI
``mcp``, 2.3.0 in its own virtualenv under ``.tools/mcp2``: the project's test
extras pin the 1.x client of ``mcp_client``) over Streamable HTTP, stateless.
It is asyncio, so tests run it as a child process:

    .tools/mcp2/bin/python tests/harness/mcp2_client.py URL [--token T] STEPS.json

STEPS.json is a list of steps; one JSON line a step is printed, then
``{"done": true, "protocolVersion", "server"}`` as the SDK negotiated them (it
probes ``server/discover`` first, as its "auto" mode does):

    ["list_tools"]                     {"tools": [name, ...], "outputSchemas": [name, ...]}
    ["call", name, arguments]          {"isError", "text", "structuredContent"}
    ["read_resource", uri]             {"contents": [...]} or {"error": message}
    ["complete", ref, name, value, context]   {"values": [...]}
    ["listen", uri, name, arguments]   subscribes to ``uri`` (subscriptions/listen), then
                                       calls tool ``name``; {"honored": [uri, ...],
                                       "updated": uri} once the update came (20 s at most)
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import PromptReference, ResourceTemplateReference


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def called(result) -> dict:
    return {
        "isError": result.is_error,
        "text": "\n".join(item.text for item in result.content if item.type == "text"),
        "structuredContent": result.structured_content,
    }


async def step(client: Client, kind: str, *args) -> dict:
    if kind == "list_tools":
        tools = (await client.list_tools()).tools
        return {
            "tools": [tool.name for tool in tools],
            "outputSchemas": [tool.name for tool in tools if tool.output_schema],
        }
    if kind == "call":
        name, arguments = args
        return called(await client.call_tool(name, arguments))
    if kind == "read_resource":
        try:
            result = await client.read_resource(args[0])
        except Exception as error:  # the SDK's MCPError: what the server said
            return {"error": str(error)}
        return {"contents": [content.model_dump(mode="json") for content in result.contents]}
    if kind == "complete":
        ref, name, value, context = args
        if ref.get("type") == "ref/prompt":
            reference = PromptReference(type="ref/prompt", name=ref["name"])
        else:
            reference = ResourceTemplateReference(type="ref/resource", uri=ref["uri"])
        result = await client.complete(reference, {"name": name, "value": value}, context)
        return {"values": result.completion.values}
    if kind == "listen":
        uri, name, arguments = args
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            honored = list(subscription.honored.resource_subscriptions or [])
            called_result = called(await client.call_tool(name, arguments))
            with anyio.fail_after(20):
                async for event in subscription:
                    if isinstance(event, ResourceUpdated):
                        return {"honored": honored, "updated": event.uri, "call": called_result}
        return {"honored": honored, "updated": None}
    raise SystemExit(f"unknown step {kind}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("steps")
    parser.add_argument("--token")
    options = parser.parse_args()
    with open(options.steps, encoding="utf-8") as f:
        steps = json.load(f)
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        transport = streamable_http_client(options.url, http_client=http)
        async with Client(transport, cache=None) as client:
            for kind, *args in steps:
                emit(await step(client, kind, *args))
            info = client.server_info
            emit(
                {
                    "done": True,
                    "protocolVersion": client.protocol_version,
                    "server": info.name if info else None,
                }
            )


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
