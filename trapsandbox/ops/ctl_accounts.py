"""
``trapsandbox-ctl accounts add|list|remove``: edit the accounts file (SPEC §12).
They need no gateway: send it SIGHUP afterwards.
"""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

from trapsandbox import limits
from trapsandbox.admission import accounts
from trapsandbox.ops.ctl_http import Failed


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


def register(commands: Any) -> None:
    """Add ``accounts`` and its actions to ``trapsandbox-ctl``'s subparsers."""
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
