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

This module is the entry point: the options every command takes, and ``main``.
The commands live by what they act on, each module registering its own:
``ctl_computers`` (computers, ping, request, exec, eval, screen, attach,
peripherals, call), ``ctl_files`` (ls, cat, put, get, rm), ``ctl_snapshots``
(snapshots, snapshot, changes, restore), ``ctl_accounts`` (accounts) and
``ctl_ops`` (health, batch, opencode-config, datapack); ``ctl_http`` holds what
they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from trapsandbox.limits import DEFAULT_CTL_URL
from trapsandbox.ops import ctl_accounts, ctl_computers, ctl_files, ctl_ops, ctl_snapshots
from trapsandbox.ops.ctl_http import Failed
from trapsandbox.ops.ctl_ops import opencode_config

__all__ = ["main", "opencode_config", "parser"]

# In the order ``trapsandbox-ctl --help`` lists them.
GROUPS = (ctl_ops, ctl_computers, ctl_files, ctl_snapshots, ctl_accounts)


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
    for group in GROUPS:
        group.register(commands)
    return top


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
