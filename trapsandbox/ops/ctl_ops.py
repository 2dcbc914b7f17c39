"""
``trapsandbox-ctl``'s commands on the gateway as a whole: its ``health``, the
``opencode-config`` block, ``batch`` (NDJSON requests over one ``/operator``
WebSocket), and the client as a ``datapack``.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from trapsandbox import limits
from trapsandbox.ops.ctl_http import Failed, call, decode, explain, has_token, token_of


def cmd_health(args: argparse.Namespace) -> int:
    health = call(args, "GET", "/health")
    print(f"sandboxOk: {_bool(health.get('sandboxOk'))}")
    print(f"opencodeOk: {_bool(health.get('opencodeOk'))}")
    if not health.get("opencodeOk"):
        print(f"opencode: {health.get('opencodeDetail')}")
    print(f"computers: {health.get('computers')}")
    print(f"version: {health.get('version')}")
    return 0 if health.get("opencodeOk") else 1


def _bool(value: Any) -> str:
    return json.dumps(value)


def opencode_config(url: str, token: bool) -> dict[str, Any]:
    """opencode's config block for this gateway's MCP endpoint (SPEC §10)."""
    server: dict[str, Any] = {"type": "remote", "url": url.rstrip("/") + "/mcp", "oauth": False}
    if token:
        # opencode reads the token from its own environment: it never lands in the file.
        server["headers"] = {"Authorization": "Bearer {env:SANDBOX_ADMIN_TOKEN}"}
    return {"mcp": {"trapsandbox": server}}


def cmd_opencode_config(args: argparse.Namespace) -> int:
    print(json.dumps(opencode_config(args.url, has_token(args)), indent=2))
    return 0


def _concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= limits.MAX_OPERATOR_IN_FLIGHT:
        raise argparse.ArgumentTypeError(f"must be 1 to {limits.MAX_OPERATOR_IN_FLIGHT}")
    return value


def cmd_batch(args: argparse.Namespace) -> int:
    from trapsandbox.ops import batch

    try:
        if args.file is None:
            data = sys.stdin.buffer.read().splitlines()
        else:
            with open(args.file, "rb") as f:
                data = f.read().splitlines()
    except OSError as error:
        raise Failed(f"cannot read {args.file}: {error.strerror}") from None
    lines = batch.read_lines(data, args.account)
    return batch.run(lines, args.url, token_of(args), args.concurrency)


def cmd_datapack(args: argparse.Namespace) -> int:
    """The gateway's data pack (GET /client/datapack.zip), written to ``args.output``."""
    base = args.url.rstrip("/")
    asked = "none" if args.no_gateway else args.gateway
    query = "?" + urllib.parse.urlencode({"url": asked}) if asked else ""
    try:
        with urllib.request.urlopen(base + "/client/datapack.zip" + query, timeout=30) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        with error:
            answer = decode(error.read(), base, error.code, strict=False)
        raise Failed(explain(error.code, answer, args)) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(getattr(error, "reason", None), "strerror", None) or str(error)
        raise Failed(f"cannot reach the gateway at {base}: {reason}") from None
    try:
        with open(args.output, "wb") as f:
            f.write(body)
    except OSError as error:
        raise Failed(f"cannot write {args.output}: {error.strerror}") from None
    named = "no gateway (sandbox setup asks)" if args.no_gateway else (args.gateway or base)
    print(f"{args.output}: {len(body)} bytes, naming {named}")
    print("put it in the world's datapacks/ folder and run /reload (or restart the server)")
    return 0


def register(commands: Any) -> None:
    """Add the gateway's commands to ``trapsandbox-ctl``'s subparsers."""
    health = commands.add_parser("health", help="the gateway's and opencode's health")
    health.set_defaults(run=cmd_health)

    many = commands.add_parser(
        "batch",
        help="send NDJSON requests over one operator WebSocket, printing each answer",
        description=(
            'Read requests, one JSON object a line: {"traposId", "type", "payload"?, '
            '"timeoutMs"?, "account"?, "id"?} (id: the line number if absent), send them over '
            "one /operator WebSocket and print each answer as one JSON line as it arrives "
            '({"id", "status", "ok", "payload"?, "error"?}). Exit status: 0 if every answer '
            "is a 200, 1 if not, 2 if the connection failed or was refused."
        ),
    )
    many.add_argument("--file", default=None, metavar="F", help="read F (default: stdin)")
    many.add_argument(
        "--concurrency",
        type=_concurrency,
        default=32,
        metavar="N",
        help="requests in flight at once (default %(default)s)",
    )
    many.set_defaults(run=cmd_batch)

    config = commands.add_parser(
        "opencode-config",
        help="print the mcp block of opencode's config for this gateway",
        description=(
            "Print the mcp block to merge into opencode.json so that opencode's agent uses "
            "the computers as tools (trapsandbox_run_lua, ...). With a token set or given, the "
            "block sends it as {env:SANDBOX_ADMIN_TOKEN}: export it where opencode runs."
        ),
    )
    config.set_defaults(run=cmd_opencode_config)

    pack = commands.add_parser(
        "datapack", help="the client as a data pack: every computer of a world gets sandbox"
    )
    pack.add_argument("-o", "--output", default="trapsandbox.zip", help="default %(default)s")
    named = pack.add_mutually_exclusive_group()
    named.add_argument(
        "--gateway",
        metavar="URL",
        help="the gateway as the computers reach it (default: as --url reaches it)",
    )
    named.add_argument(
        "--no-gateway", action="store_true", help="name none: sandbox setup asks each player"
    )
    pack.set_defaults(run=cmd_datapack)
