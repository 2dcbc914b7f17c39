"""
``trapsandbox-ctl``'s commands on the computers themselves: list them, ping one,
send it a request, run a program or Lua on it, look at its screen (once, or live
with ``attach``), its peripherals and their methods.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any

from trapsandbox import limits
from trapsandbox.limits import CTL_HTTP_MARGIN, CTL_PING_TIMEOUT, MAX_REQUEST_TIMEOUT
from trapsandbox.ops.ctl_http import Failed, call, computer_path, on_computer, token_of


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
        args, "POST", computer_path(args.trapos_id, account=args.account), body, http_timeout
    )


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
        computer_path(args.trapos_id, "execute", args.account),
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
        computer_path(args.trapos_id, "eval", args.account),
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


def cmd_screen(args: argparse.Namespace) -> int:
    answer = call(args, "GET", computer_path(args.trapos_id, "screen", args.account))
    for line in answer.get("lines") or []:
        print(line.rstrip())
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    from trapsandbox.ops import attach  # termios: only where a terminal is attached

    return attach.run(args, call, token_of(args), computer_path, Failed)


def cmd_peripherals(args: argparse.Namespace) -> int:
    answer = call(args, "GET", computer_path(args.trapos_id, "peripherals", args.account))
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
    answer = call(args, "POST", computer_path(args.trapos_id, action, args.account), body)
    for value in answer.get("returns") or []:
        print(json.dumps(value))
    return 0


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


def register(commands: Any) -> None:
    """Add the computer commands to ``trapsandbox-ctl``'s subparsers."""
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

    run = on_computer(
        commands, "exec", "run a program on a computer, streaming its output", cmd_exec
    )
    run.add_argument("--cwd", default=None, help="working directory on the computer")
    run.add_argument("--timeout", type=_seconds, default=None, help="seconds (default 30)")
    # Everything after "--" is the command line, options of its own included (see ctl.main).
    run.add_argument("program", nargs="*", metavar="-- CMD ARGS")
    evaluate = on_computer(
        commands, "eval", "run Lua code on a computer", cmd_eval, ("code", "CODE")
    )
    evaluate.add_argument("--timeout", type=_seconds, default=None, help="seconds (default 30)")
    on_computer(commands, "screen", "show a computer's screen", cmd_screen)
    on_computer(commands, "attach", "watch a computer's screen live and type into it", cmd_attach)
    on_computer(
        commands,
        "peripherals",
        "list a computer's peripherals and their methods",
        cmd_peripherals,
    )
    calling = on_computer(
        commands,
        "call",
        "call a peripheral's method (each ARG is JSON; a plain word is text)",
        cmd_call,
        ("name", "NAME"),
        ("method", "METHOD"),
    )
    calling.add_argument("args", nargs="*", metavar="ARGS")
