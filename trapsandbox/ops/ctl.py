"""
``trapsandbox-ctl``: the operator's command line for a running gateway.

    trapsandbox-ctl health
    trapsandbox-ctl computers
    trapsandbox-ctl ping 7:base
    trapsandbox-ctl request 7:base TYPE [--payload JSON] [--timeout SECONDS]
    trapsandbox-ctl exec 7:base [--timeout S] -- CMD ARGS...   (streams; exits with its code)
    trapsandbox-ctl eval 7:base 'return os.time()'
    trapsandbox-ctl ls 7:base /            cat 7:base /startup.lua
    trapsandbox-ctl put 7:base LOCAL REMOTE    get 7:base REMOTE LOCAL
    trapsandbox-ctl rm 7:base REMOTE       screen 7:base
    trapsandbox-ctl attach 7:base          (the live screen; keys forwarded; Ctrl-] leaves)
    trapsandbox-ctl snapshots 7:base       snapshot 7:base   (list; take one now)
    trapsandbox-ctl changes 7:base SNAP    restore 7:base SNAP   (SPEC §15)
    trapsandbox-ctl peripherals 7:base     call 7:base top write '"hi"'   (JSON args)
    trapsandbox-ctl opencode-config        (the "mcp" block for opencode's config)
    trapsandbox-ctl batch [--file F] [--concurrency N]   (NDJSON requests over one WebSocket)
    trapsandbox-ctl accounts add NAME --file F [--max-computers N]
    trapsandbox-ctl accounts list --file F     accounts remove NAME --file F
    trapsandbox-ctl datapack [-o trapsandbox.zip] [--gateway URL | --no-gateway]
                                           (the client as a data pack for a world's datapacks/)

``--account NAME`` (the admin token only) picks the account of a traposId that
several accounts hold.  The ``accounts`` commands edit the accounts file
(SPEC §12) and need no gateway: send it SIGHUP afterwards.

It speaks the gateway's operator HTTP API with the standard library only, so
it starts fast and needs no reactor.  Exit status: 0 on success, 1 on a
failure (with one line on stderr saying what failed), 2 on a usage error.
``batch`` alone runs the reactor (``trapsandbox.ops.batch``): it exits 0 when
every answer is a 200, 1 when one is not, 2 when the connection failed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from trapsandbox import limits
from trapsandbox.admission import accounts
from trapsandbox.limits import (
    CTL_HTTP_MARGIN,
    CTL_PING_TIMEOUT,
    DEFAULT_CTL_URL,
    MAX_REQUEST_TIMEOUT,
)

NDJSON = "application/x-ndjson"


class Failed(Exception):
    """A failure to report in one line."""


def _token(args: argparse.Namespace) -> str | None:
    if args.token:
        return args.token
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as error:
            raise Failed(
                f"cannot read the token file {args.token_file}: {error.strerror}"
            ) from None
    return None


def call(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: Any = None,
    timeout: float = 30.0,
    lines: Any = None,
) -> Any:
    """
    One API call; the decoded JSON answer, or ``Failed``.  With ``lines``, an
    NDJSON answer is handed to it one decoded line at a time as it arrives.
    """
    base = args.url.rstrip("/")
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    token = _token(args)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if lines is not None and response.headers.get_content_type() == NDJSON:
                for line in response:
                    lines(_decode(line, base, response.status))
                return None
            return _decode(response.read(), base, response.status)
    except urllib.error.HTTPError as error:
        with error:
            answer = _decode(error.read(), base, error.code, strict=False)
        raise Failed(_explain(error.code, answer, args)) from None
    except urllib.error.URLError as error:
        reason = getattr(error.reason, "strerror", None) or str(error.reason)
        raise Failed(f"cannot reach the gateway at {base}: {reason}") from None
    except TimeoutError:
        raise Failed(f"the gateway at {base} did not answer within {timeout:g} s") from None
    except OSError as error:
        raise Failed(f"cannot talk to the gateway at {base}: {error}") from None


def _decode(body: bytes, base: str, status: int, strict: bool = True) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        if strict:
            raise Failed(f"{base} answered {status} with something not JSON: is it trapsandbox?")
        return None


def _explain(status: int, answer: Any, args: argparse.Namespace) -> str:
    """The one line for an HTTP error answer."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, str) and "code" in answer:
        # The sandbox endpoints' shape, {ok: false, error: "<message>", code}: the
        # computer's or the gateway's refusal of the operation, not of the operator.
        return f"{answer['code']}: {error}"
    if not isinstance(error, dict):
        return f"the gateway at {args.url} answered HTTP {status}: is it trapsandbox?"
    code, message = error.get("code", "error"), error.get("message", "")
    if status == 401:
        hint = " (give --token or set SANDBOX_ADMIN_TOKEN)" if not _has_token(args) else ""
        return f"unauthorized: {message}{hint}"
    if status == 403:
        return f"forbidden: {message}; give --token from a non-loopback host"
    return f"{code}: {message}"


def _has_token(args: argparse.Namespace) -> bool:
    return bool(args.token or args.token_file)


def _computer_path(trapos_id: str, action: str = "requests", account: str | None = None) -> str:
    path = f"/computers/{urllib.parse.quote(trapos_id, safe='')}/{action}"
    if account:
        path += "?" + urllib.parse.urlencode({"account": account})
    return path


def _send(args: argparse.Namespace, type: str, payload: Any, timeout: float | None) -> Any:
    body: dict[str, Any] = {"type": type}
    if payload is not None:
        body["payload"] = payload
    if timeout is not None:
        body["timeoutMs"] = timeout * 1000
    # Without a timeout of its own the request lasts as long as the gateway's
    # default, which only the gateway knows: wait as long as it may take.
    http_timeout = (timeout or MAX_REQUEST_TIMEOUT) + CTL_HTTP_MARGIN
    return call(
        args, "POST", _computer_path(args.trapos_id, account=args.account), body, http_timeout
    )


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


def cmd_computers(args: argparse.Namespace) -> int:
    computers = call(args, "GET", "/computers")["computers"]
    if not computers:
        print("no computers connected")
        return 0
    header = ("TRAPOS ID", "ACCOUNT", "PEER", "CONNECTED SINCE", "VERSION", "IN FLIGHT")
    rows = [
        (
            c["traposId"],
            c["accountId"],
            c["peer"],
            c["connectedSince"],
            c.get("version") or "-",
            str(c.get("inFlight", 0)),
        )
        for c in computers
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def cmd_ping(args: argparse.Namespace) -> int:
    started = time.monotonic()
    answer = _send(args, "ping", None, args.timeout)
    elapsed = (time.monotonic() - started) * 1000
    if not answer.get("ok"):
        raise Failed(_answer_error(args, "ping", answer))
    print(f"{args.trapos_id} answered ping in {elapsed:.0f} ms")
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    answer = _send(args, args.type, args.payload, args.timeout)
    if not answer.get("ok"):
        raise Failed(_answer_error(args, args.type, answer))
    print(json.dumps(answer.get("payload", {}), indent=2, ensure_ascii=False))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    command = list(args.program)
    if not command:
        raise Failed("exec needs a command: trapsandbox-ctl exec ID -- CMD ARGS...")
    body: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if args.cwd is not None:
        body["cwd"] = args.cwd
    if args.timeout is not None:
        body["timeoutMs"] = args.timeout * 1000
    run = (args.timeout or limits.DEFAULT_RUN_TIMEOUT_MS / 1000) + limits.RUN_ANSWER_MARGIN
    outcome: dict[str, Any] = {}

    def line(obj: Any) -> None:
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "stdout_delta":
            sys.stdout.write(obj.get("data", ""))
            sys.stdout.flush()
        elif kind == "stderr_delta":
            sys.stderr.write(obj.get("data", ""))
            sys.stderr.flush()
        elif kind in ("result", "error"):
            outcome.update(obj)

    call(
        args,
        "POST",
        _computer_path(args.trapos_id, "execute", args.account),
        body,
        run + CTL_HTTP_MARGIN,
        lines=line,
    )
    if outcome.get("type") == "error":
        raise Failed(f"{args.trapos_id}: {outcome.get('code')}: {outcome.get('error')}")
    if outcome.get("type") != "result":
        raise Failed(f"the gateway's answer ended before the result of {command[0]}")
    if outcome.get("timedOut"):
        print(f"trapsandbox-ctl: {command[0]} timed out on {args.trapos_id}", file=sys.stderr)
    code = outcome.get("exitCode")
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def cmd_eval(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"code": args.code}
    if args.timeout is not None:
        body["timeoutMs"] = args.timeout * 1000
    run = (args.timeout or limits.DEFAULT_RUN_TIMEOUT_MS / 1000) + limits.RUN_ANSWER_MARGIN
    answer = call(
        args,
        "POST",
        _computer_path(args.trapos_id, "eval", args.account),
        body,
        run + CTL_HTTP_MARGIN,
    )
    if answer.get("stdout"):
        sys.stdout.write(answer["stdout"])
    for value in answer.get("returns") or []:
        print(value)
    if not answer.get("ok"):
        print(f"trapsandbox-ctl: {answer.get('error')}", file=sys.stderr)
        return 1
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    answer = call(
        args,
        "POST",
        _computer_path(args.trapos_id, "list-files", args.account),
        {"path": args.path},
    )
    for entry in answer.get("entries") or []:
        name = entry.get("name", "?") + ("/" if entry.get("type") == "dir" else "")
        flags = "r" if entry.get("readOnly") else " "
        print(f"{flags} {entry.get('size', 0):>8}  {name}")
    return 0


def _read(args: argparse.Namespace, path: str) -> bytes:
    body = {"path": path, "encoding": "base64"}
    answer = call(args, "POST", _computer_path(args.trapos_id, "read-file", args.account), body)
    content = base64.b64decode(answer.get("content") or "")
    if answer.get("sizeBytes", len(content)) > answer.get("offset", 0) + len(content):
        print(
            f"trapsandbox-ctl: {path} is {answer['sizeBytes']} bytes; only the first "
            f"{len(content)} were read",
            file=sys.stderr,
        )
    return content


def cmd_cat(args: argparse.Namespace) -> int:
    sys.stdout.buffer.write(_read(args, args.path))
    sys.stdout.flush()
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    content = _read(args, args.remote)
    try:
        with open(args.local, "wb") as f:
            f.write(content)
    except OSError as error:
        raise Failed(f"cannot write {args.local}: {error.strerror}") from None
    print(f"{args.trapos_id}:{args.remote} -> {args.local} ({len(content)} bytes)")
    return 0


def cmd_put(args: argparse.Namespace) -> int:
    try:
        with open(args.local, "rb") as f:
            content = f.read()
    except OSError as error:
        raise Failed(f"cannot read {args.local}: {error.strerror}") from None
    body = {
        "path": args.remote,
        "content": base64.b64encode(content).decode("ascii"),
        "encoding": "base64",
    }
    answer = call(
        args, "POST", _computer_path(args.trapos_id, "write-file", args.account), body, 120.0
    )
    print(f"{args.local} -> {args.trapos_id}:{args.remote} ({answer.get('bytesWritten')} bytes)")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    answer = call(
        args,
        "POST",
        _computer_path(args.trapos_id, "delete-file", args.account),
        {"path": args.path},
    )
    if not answer.get("deleted"):
        raise Failed(f"{args.trapos_id}: {args.path} does not exist")
    return 0


def cmd_screen(args: argparse.Namespace) -> int:
    answer = call(args, "GET", _computer_path(args.trapos_id, "screen", args.account))
    for line in answer.get("lines") or []:
        print(line.rstrip())
    return 0


def cmd_peripherals(args: argparse.Namespace) -> int:
    answer = call(args, "GET", _computer_path(args.trapos_id, "peripherals", args.account))
    for each in answer.get("peripherals") or []:
        types = ",".join(each.get("types") or [])
        print(f"{each.get('name', '?')}  {types}  {' '.join(each.get('methods') or [])}")
    return 0


def _json_value(text: str) -> Any:
    """A peripheral call's argument: JSON (1, true, "x", [1]); a word that is not JSON is text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_call(args: argparse.Namespace) -> int:
    action = "peripherals/" + urllib.parse.quote(args.name, safe="") + "/call"
    body = {"method": args.method, "args": [_json_value(arg) for arg in args.args]}
    answer = call(args, "POST", _computer_path(args.trapos_id, action, args.account), body)
    for value in answer.get("returns") or []:
        print(json.dumps(value))
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    from trapsandbox.ops import attach  # termios: only where a terminal is attached

    return attach.run(args, call, _token(args), _computer_path, Failed)


# -- Snapshots (SPEC §15) ----------------------------------------------------------------------


def _snapshot_path(args: argparse.Namespace, tail: str = "") -> str:
    action = "snapshots" + (f"/{urllib.parse.quote(args.snapshot, safe='')}{tail}" if tail else "")
    return _computer_path(args.trapos_id, action, args.account)


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def cmd_snapshots(args: argparse.Namespace) -> int:
    answer = call(args, "GET", _snapshot_path(args))
    listed = answer.get("snapshots") or []
    if not listed:
        print(f"{args.trapos_id} has no snapshots (take one: trapsandbox-ctl snapshot ID)")
        return 0
    print(f"{'ID':>4}  {'CREATED (UTC)':<19}  {'REASON':<7}  {'FILES':>5}  {'BYTES':>9}")
    for each in listed:
        print(
            f"{each.get('id', '?'):>4}  {_when(each.get('created')):<19}  "
            f"{each.get('reason', '?'):<7}  {each.get('files', 0):>5}  {each.get('bytes', 0):>9}"
        )
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    answer = call(args, "POST", _snapshot_path(args), {}, limits.CTL_SNAPSHOT_TIMEOUT)
    print(
        f"snapshot {answer.get('id')} of {args.trapos_id}: {answer.get('files')} files, "
        f"{answer.get('bytes')} bytes ({answer.get('fetched')} fetched)"
    )
    return 0


def _size(change: dict[str, Any]) -> str:
    before, after = change.get("before"), change.get("after")
    if before is None:
        return f"{after} bytes"
    if after is None:
        return f"{before} bytes"
    return f"{before} -> {after} bytes"


def cmd_changes(args: argparse.Namespace) -> int:
    answer = call(args, "GET", _snapshot_path(args, "/changes"), None, limits.CTL_SNAPSHOT_TIMEOUT)
    rows = [
        (kind, change)
        for kind in ("added", "modified", "deleted")
        for change in answer.get(kind) or []
    ]
    if not rows:
        print(f"no changes on {args.trapos_id} since snapshot {args.snapshot}")
        return 0
    print(f"{len(rows)} changes on {args.trapos_id} since snapshot {args.snapshot}:")
    for kind, change in rows:
        print(f"  {kind:<9} {change.get('path')} ({_size(change)})")
    for each in answer.get("diffs") or []:
        print()
        print(each.get("diff", ""))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    answer = call(args, "POST", _snapshot_path(args, "/restore"), {}, limits.CTL_SNAPSHOT_TIMEOUT)
    deleted, written = answer.get("deleted") or [], answer.get("written") or []
    print(
        f"restored {args.trapos_id} to snapshot {answer.get('restored')}: "
        f"{len(written)} written, {len(deleted)} deleted"
    )
    for path in written:
        print(f"  wrote   {path}")
    for path in deleted:
        print(f"  deleted {path}")
    print(
        f"undo with: trapsandbox-ctl restore {args.trapos_id} {answer.get('before')} "
        f"(the snapshot taken just before)"
    )
    return 0


def opencode_config(url: str, token: bool) -> dict[str, Any]:
    """opencode's config block for this gateway's MCP endpoint (SPEC §10)."""
    server: dict[str, Any] = {"type": "remote", "url": url.rstrip("/") + "/mcp", "oauth": False}
    if token:
        # opencode reads the token from its own environment: it never lands in the file.
        server["headers"] = {"Authorization": "Bearer {env:SANDBOX_ADMIN_TOKEN}"}
    return {"mcp": {"trapsandbox": server}}


def cmd_opencode_config(args: argparse.Namespace) -> int:
    print(json.dumps(opencode_config(args.url, _has_token(args)), indent=2))
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
    return batch.run(lines, args.url, _token(args), args.concurrency)


def _answer_error(args: argparse.Namespace, type: str, answer: Any) -> str:
    error = answer.get("error") or {}
    return (
        f"{args.trapos_id} answered {type} with an error: "
        f"{error.get('code', '?')}: {error.get('message', '')}"
    )


def _json_object(text: str) -> dict[str, Any]:
    if text.startswith("@"):
        # A payload too long for a command line (or kept in a file).
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as error:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {error.strerror}") from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_REQUEST_TIMEOUT:
        raise argparse.ArgumentTypeError("must be a number of seconds, more than 0")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="trapsandbox-ctl",
        description="Talk to a running trapsandbox gateway (its operator HTTP API).",
    )
    top.add_argument(
        "--url",
        default=os.environ.get("TRAPSANDBOX_URL") or DEFAULT_CTL_URL,
        help="the gateway (env TRAPSANDBOX_URL; default %(default)s)",
    )
    top.add_argument(
        "--token",
        default=os.environ.get("SANDBOX_ADMIN_TOKEN") or None,
        help="the operator bearer token (env SANDBOX_ADMIN_TOKEN)",
    )
    top.add_argument(
        "--token-file",
        default=os.environ.get("SANDBOX_ADMIN_TOKEN_FILE") or None,
        help="read the token from this file (env SANDBOX_ADMIN_TOKEN_FILE)",
    )
    top.add_argument(
        "--account",
        default=None,
        metavar="NAME",
        help="with the admin token: the account of the computer named (when several hold it)",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    health = commands.add_parser("health", help="the gateway's and opencode's health")
    health.set_defaults(run=cmd_health)

    computers = commands.add_parser("computers", help="the connected computers")
    computers.set_defaults(run=cmd_computers)

    ping = commands.add_parser("ping", help="ping one computer")
    ping.add_argument("trapos_id", metavar="TRAPOSID", help='e.g. "7:base" or "7:"')
    ping.add_argument("--timeout", type=_seconds, default=CTL_PING_TIMEOUT, help="seconds")
    ping.set_defaults(run=cmd_ping)

    request = commands.add_parser("request", help="send one request to a computer")
    request.add_argument("trapos_id", metavar="TRAPOSID")
    request.add_argument("type", metavar="TYPE")
    request.add_argument(
        "--payload", type=_json_object, default=None, help="a JSON object, or @FILE holding one"
    )
    request.add_argument(
        "--timeout", type=_seconds, default=None, help="seconds (default: the gateway's)"
    )
    request.set_defaults(run=cmd_request)

    def on_computer(name: str, help: str, run: Any, *arguments: tuple[str, str]) -> Any:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("trapos_id", metavar="TRAPOSID")
        for dest, metavar in arguments:
            sub.add_argument(dest, metavar=metavar)
        sub.set_defaults(run=run)
        return sub

    run = on_computer("exec", "run a program on a computer, streaming its output", cmd_exec)
    run.add_argument("--cwd", default=None, help="working directory on the computer")
    run.add_argument("--timeout", type=_seconds, default=None, help="seconds (default 30)")
    # Everything after "--" is the command line, options of its own included (see main).
    run.add_argument("program", nargs="*", metavar="-- CMD ARGS")
    evaluate = on_computer("eval", "run Lua code on a computer", cmd_eval, ("code", "CODE"))
    evaluate.add_argument("--timeout", type=_seconds, default=None, help="seconds (default 30)")
    on_computer("ls", "list a folder on a computer", cmd_ls, ("path", "PATH"))
    on_computer("cat", "print a file of a computer", cmd_cat, ("path", "PATH"))
    on_computer(
        "put", "copy a file to a computer", cmd_put, ("local", "LOCAL"), ("remote", "REMOTE")
    )
    on_computer(
        "get", "copy a file from a computer", cmd_get, ("remote", "REMOTE"), ("local", "LOCAL")
    )
    on_computer("rm", "delete a file on a computer", cmd_rm, ("path", "PATH"))
    on_computer("screen", "show a computer's screen", cmd_screen)
    on_computer("attach", "watch a computer's screen live and type into it", cmd_attach)
    on_computer("snapshots", "list a computer's snapshots of its files", cmd_snapshots)
    on_computer("snapshot", "take a snapshot of a computer's files now", cmd_snapshot)
    on_computer(
        "changes", "what changed on a computer since a snapshot", cmd_changes, ("snapshot", "SNAP")
    )
    on_computer(
        "restore",
        "bring a computer's files back to a snapshot (undoable)",
        cmd_restore,
        ("snapshot", "SNAP"),
    )
    on_computer("peripherals", "list a computer's peripherals and their methods", cmd_peripherals)
    calling = on_computer(
        "call",
        "call a peripheral's method (each ARG is JSON; a plain word is text)",
        cmd_call,
        ("name", "NAME"),
        ("method", "METHOD"),
    )
    calling.add_argument("args", nargs="*", metavar="ARGS")

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

    accounts_parser = commands.add_parser(
        "accounts",
        help="add, list or remove the accounts of an accounts file",
        description=(
            "Edit SANDBOX_ACCOUNTS_FILE (players sharing this gateway). Only the SHA-256 of "
            "secrets and tokens is written; reload the gateway (SIGHUP) afterwards."
        ),
    )
    each = accounts_parser.add_subparsers(dest="accounts_command", required=True, metavar="ACTION")
    add = each.add_parser("add", help="add an account; prints its secret and token once")
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--max-computers", type=int, default=None, metavar="N", help="most computers at once"
    )
    add.add_argument(
        "--gateway-url",
        default=None,
        metavar="URL",
        help="the URL computers reach the gateway at, for the install line (default: --url)",
    )
    add.set_defaults(run=cmd_accounts_add)
    listing = each.add_parser("list", help="list the accounts")
    listing.set_defaults(run=cmd_accounts_list)
    remove = each.add_parser("remove", help="remove an account")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(run=cmd_accounts_remove)
    for sub in (add, listing, remove):
        sub.add_argument(
            "--file",
            required=not os.environ.get("SANDBOX_ACCOUNTS_FILE"),
            default=os.environ.get("SANDBOX_ACCOUNTS_FILE") or None,
            metavar="F",
            help="the accounts file (env SANDBOX_ACCOUNTS_FILE)",
        )
    return top


def _accounts_text(path: str) -> str:
    try:
        text = accounts.read_text(path)
        accounts.parse(text)
    except OSError as error:
        raise Failed(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise Failed(f"{path}: not UTF-8 text") from None
    except ValueError as error:
        raise Failed(f"{path}: {error}") from None
    return text


def _write_accounts(path: str, text: str) -> None:
    try:
        accounts.write_text(path, text)
    except OSError as error:
        raise Failed(f"cannot write {path}: {error.strerror}") from None


def cmd_accounts_add(args: argparse.Namespace) -> int:
    name = args.name
    if not accounts.NAME.match(name) or name == limits.LOCAL_ACCOUNT:
        raise Failed(
            f"{name!r} cannot be an account name: 1 to 64 of A-Z a-z 0-9 _ -, and not "
            f"{limits.LOCAL_ACCOUNT!r} (the SANDBOX_PASSWORD's)"
        )
    if args.max_computers is not None and args.max_computers < 1:
        raise Failed("--max-computers must be at least 1")
    text = _accounts_text(args.file)
    # 128 bits each: hex for the secret (typed into a computer), URL-safe for the token.
    secret = secrets.token_hex(16)
    token = secrets.token_urlsafe(24)
    account = accounts.Account(
        name, accounts.sha256_hex(secret), accounts.sha256_hex(token), args.max_computers
    )
    try:
        new = accounts.with_account(text, account)
    except ValueError as error:
        raise Failed(f"{args.file}: {error}") from None
    _write_accounts(args.file, new)
    url = (args.gateway_url or args.url).rstrip("/")
    print(f"account {name} added to {args.file} (it keeps only hashes: note these now)")
    print()
    print(f"  computer secret: {secret}")
    print(f"  operator token:  {token}")
    print()
    print("Reload the gateway to use it: systemctl reload trapsandbox (or kill -HUP its pid).")
    print()
    print(f"On each of {name}'s computers, in the game, install the client with the secret:")
    print(f"  wget run {url}/client/install.lua {secret}")
    print("or, on a computer that already has the client:")
    print(f"  set sandbox.password {secret}")
    print("  reboot")
    print()
    print(f"{name}'s operator commands (they see only {name}'s computers):")
    print(f"  trapsandbox-ctl --url {url} --token {token} computers")
    return 0


def cmd_accounts_list(args: argparse.Namespace) -> int:
    found = accounts.parse(_accounts_text(args.file))
    if not found:
        print(f"no accounts in {args.file}")
        return 0
    for account in found.by_name.values():
        most = account.max_computers
        print(f"{account.name}  max_computers={'-' if most is None else most}")
    return 0


def cmd_accounts_remove(args: argparse.Namespace) -> int:
    text = _accounts_text(args.file)
    try:
        new = accounts.without_account(text, args.name)
    except ValueError as error:
        raise Failed(f"{args.file}: {error}") from None
    _write_accounts(args.file, new)
    print(
        f"account {args.name} removed from {args.file}; reload the gateway to close its computers"
    )
    return 0


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
            answer = _decode(error.read(), base, error.code, strict=False)
        raise Failed(_explain(error.code, answer, args)) from None
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program = None
    if "--" in argv:
        # argparse mishandles "--" inside a subcommand: split it off here.
        program, argv = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    args = parser().parse_args(argv)
    if program is not None:
        if args.command != "exec":
            parser().error("only exec takes -- CMD ARGS")
        args.program = [*args.program, *program]
    try:
        return args.run(args)
    except Failed as failure:
        print(f"trapsandbox-ctl: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`trapsandbox-ctl screen 1 | head`): stop quietly, as
        # coreutils do, and keep Python from complaining about stdout again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
