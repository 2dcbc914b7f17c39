"""
``trapsandbox-ctl``'s snapshot commands (SPEC §15): list a computer's snapshots,
take one, what changed since one, and restore one (undoable).
"""

from __future__ import annotations

import argparse
import time
import urllib.parse
from typing import Any

from trapsandbox import limits
from trapsandbox.ops.ctl_http import call, computer_path, on_computer


def _snapshot_path(args: argparse.Namespace, tail: str = "") -> str:
    action = "snapshots" + (f"/{urllib.parse.quote(args.snapshot, safe='')}{tail}" if tail else "")
    return computer_path(args.trapos_id, action, args.account)


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


def register(commands: Any) -> None:
    """Add the snapshot commands to ``trapsandbox-ctl``'s subparsers."""
    on_computer(commands, "snapshots", "list a computer's snapshots of its files", cmd_snapshots)
    on_computer(commands, "snapshot", "take a snapshot of a computer's files now", cmd_snapshot)
    on_computer(
        commands,
        "changes",
        "what changed on a computer since a snapshot",
        cmd_changes,
        ("snapshot", "SNAP"),
    )
    on_computer(
        commands,
        "restore",
        "bring a computer's files back to a snapshot (undoable)",
        cmd_restore,
        ("snapshot", "SNAP"),
    )
