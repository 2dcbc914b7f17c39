"""
An independent MCP client for tests: the official MCP Python SDK (PyPI ``mcp``)
over Streamable HTTP.  It is asyncio, so tests run it as a child process:

    python -m tests.harness.mcp_client URL [--token T] STEPS.json

STEPS.json is a list of steps; one JSON line a step is printed, then
``{"done": true, ...}`` with what ``initialize`` agreed on:

    ["list_tools"]                      {"tools": [...]}
    ["call", name, arguments]           {"isError", "text", "structuredContent"}
    ["call_progress", name, arguments]  the same with "progress": [[progress, total,
                                        message, seconds since the call], ...]
    ["cancel", name, arguments]         a call with progress, cancelled (notifications/
                                        cancelled) at its first progress: {"cancelled": id,
                                        "answered": bool (whether a response came anyway)}
    ["list_resources"]                  {"resources": [uri, ...], "templates": [...]}
    ["read_resource", uri]              {"contents": [...]} or {"error": message}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from datetime import timedelta

import anyio
import httpx
from mcp import ClientSession, McpError, types
from mcp.client.streamable_http import streamable_http_client


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def called(result, **more) -> dict:
    return {
        "isError": result.isError,
        "text": "\n".join(item.text for item in result.content if item.type == "text"),
        "structuredContent": result.structuredContent,
        **more,
    }


async def call_progress(session: ClientSession, name: str, arguments: dict) -> None:
    heard = []
    started = time.monotonic()

    async def progress(value, total, message) -> None:
        heard.append([value, total, message, round(time.monotonic() - started, 3)])

    result = await session.call_tool(
        name, arguments, read_timeout_seconds=timedelta(seconds=700), progress_callback=progress
    )
    emit(called(result, progress=heard))


async def cancel(session: ClientSession, name: str, arguments: dict) -> None:
    """Call, and cancel the call once its first progress shows it runs."""
    request_id = session._request_id  # the SDK numbers its requests in order
    running = anyio.Event()
    answered = []

    async def progress(value, total, message) -> None:
        running.set()

    async def call() -> None:
        try:
            await session.call_tool(name, arguments, progress_callback=progress)
            answered.append(True)
        except McpError:
            answered.append(True)

    with anyio.open_signal_receiver(signal.SIGUSR1) as signals:
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(30):
                await running.wait()
            await session.send_notification(
                types.ClientNotification(
                    types.CancelledNotification(
                        params=types.CancelledNotificationParams(
                            requestId=request_id, reason="test"
                        )
                    )
                )
            )
            emit({"cancelling": request_id})
            # No response comes for a cancelled request.  The test sends SIGUSR1 once the run
            # has ended on the computer, when a response would have been sent; a ping answered
            # after that gives it the time to arrive.
            with anyio.fail_after(30):
                async for _ in signals:
                    break
                await session.send_ping()
            group.cancel_scope.cancel()
    emit({"cancelled": request_id, "answered": bool(answered)})


async def run(url: str, token: str | None, steps: list) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60, read=700)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                for step in steps:
                    if step[0] == "list_tools":
                        listed = await session.list_tools()
                        emit({"tools": [tool.name for tool in listed.tools]})
                    elif step[0] == "call":
                        emit(called(await session.call_tool(step[1], step[2])))
                    elif step[0] == "call_progress":
                        await call_progress(session, step[1], step[2])
                    elif step[0] == "cancel":
                        await cancel(session, step[1], step[2])
                    elif step[0] == "list_resources":
                        listed = await session.list_resources()
                        templates = await session.list_resource_templates()
                        emit(
                            {
                                "resources": [str(r.uri) for r in listed.resources],
                                "templates": [t.uriTemplate for t in templates.resourceTemplates],
                            }
                        )
                    elif step[0] == "read_resource":
                        try:
                            read = await session.read_resource(step[1])
                        except McpError as error:
                            emit({"error": error.error.message})
                        else:
                            emit({"contents": [c.model_dump(mode="json") for c in read.contents]})
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
