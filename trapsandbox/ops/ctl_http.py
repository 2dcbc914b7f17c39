"""
What every ``trapsandbox-ctl`` command shares: the one-line ``Failed``, the
operator token, ``call`` (one request to the gateway's operator HTTP API,
standard library only), how an error answer reads, and the computer commands'
common arguments.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

NDJSON = "application/x-ndjson"


class Failed(Exception):
    """A failure to report in one line."""


def token_of(args: argparse.Namespace) -> str | None:
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
    token = token_of(args)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if lines is not None and response.headers.get_content_type() == NDJSON:
                for line in response:
                    lines(decode(line, base, response.status))
                return None
            return decode(response.read(), base, response.status)
    except urllib.error.HTTPError as error:
        with error:
            answer = decode(error.read(), base, error.code, strict=False)
        raise Failed(explain(error.code, answer, args)) from None
    except urllib.error.URLError as error:
        reason = getattr(error.reason, "strerror", None) or str(error.reason)
        raise Failed(f"cannot reach the gateway at {base}: {reason}") from None
    except TimeoutError:
        raise Failed(f"the gateway at {base} did not answer within {timeout:g} s") from None
    except OSError as error:
        raise Failed(f"cannot talk to the gateway at {base}: {error}") from None


def decode(body: bytes, base: str, status: int, strict: bool = True) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        if strict:
            raise Failed(f"{base} answered {status} with something not JSON: is it trapsandbox?")
        return None


def explain(status: int, answer: Any, args: argparse.Namespace) -> str:
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
        hint = " (give --token or set SANDBOX_ADMIN_TOKEN)" if not has_token(args) else ""
        return f"unauthorized: {message}{hint}"
    if status == 403:
        return f"forbidden: {message}; give --token from a non-loopback host"
    return f"{code}: {message}"


def has_token(args: argparse.Namespace) -> bool:
    return bool(args.token or args.token_file)


def computer_path(trapos_id: str, action: str = "requests", account: str | None = None) -> str:
    path = f"/computers/{urllib.parse.quote(trapos_id, safe='')}/{action}"
    if account:
        path += "?" + urllib.parse.urlencode({"account": account})
    return path


def on_computer(commands: Any, name: str, help: str, run: Any, *arguments: tuple[str, str]) -> Any:
    """A subcommand on one computer: ``TRAPOSID`` first, then ``arguments`` (dest, metavar)."""
    sub = commands.add_parser(name, help=help)
    sub.add_argument("trapos_id", metavar="TRAPOSID")
    for dest, metavar in arguments:
        sub.add_argument(dest, metavar=metavar)
    sub.set_defaults(run=run)
    return sub
