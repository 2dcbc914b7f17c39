"""
``trapsandbox-ctl``'s commands on a computer's files: ``ls``, ``cat``, ``put``,
``get``, ``rm``.
"""

from __future__ import annotations

import argparse
import base64
import sys
from typing import Any

from trapsandbox.ops.ctl_http import Failed, call, computer_path, on_computer


def cmd_ls(args: argparse.Namespace) -> int:
    answer = call(
        args,
        "POST",
        computer_path(args.trapos_id, "list-files", args.account),
        {"path": args.path},
    )
    for entry in answer.get("entries") or []:
        name = entry.get("name", "?") + ("/" if entry.get("type") == "dir" else "")
        flags = "r" if entry.get("readOnly") else " "
        print(f"{flags} {entry.get('size', 0):>8}  {name}")
    return 0


def _read(args: argparse.Namespace, path: str) -> bytes:
    body = {"path": path, "encoding": "base64"}
    answer = call(args, "POST", computer_path(args.trapos_id, "read-file", args.account), body)
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
        args, "POST", computer_path(args.trapos_id, "write-file", args.account), body, 120.0
    )
    print(f"{args.local} -> {args.trapos_id}:{args.remote} ({answer.get('bytesWritten')} bytes)")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    answer = call(
        args,
        "POST",
        computer_path(args.trapos_id, "delete-file", args.account),
        {"path": args.path},
    )
    if not answer.get("deleted"):
        raise Failed(f"{args.trapos_id}: {args.path} does not exist")
    return 0


def register(commands: Any) -> None:
    """Add the file commands to ``trapsandbox-ctl``'s subparsers."""
    on_computer(commands, "ls", "list a folder on a computer", cmd_ls, ("path", "PATH"))
    on_computer(commands, "cat", "print a file of a computer", cmd_cat, ("path", "PATH"))
    on_computer(
        commands,
        "put",
        "copy a file to a computer",
        cmd_put,
        ("local", "LOCAL"),
        ("remote", "REMOTE"),
    )
    on_computer(
        commands,
        "get",
        "copy a file from a computer",
        cmd_get,
        ("remote", "REMOTE"),
        ("local", "LOCAL"),
    )
    on_computer(commands, "rm", "delete a file on a computer", cmd_rm, ("path", "PATH"))
