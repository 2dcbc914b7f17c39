"""
The accounts file (SPEC §12): several players on one gateway.

    [accounts.alice]
    secret_sha256 = "<hex SHA-256 of the secret alice's computers present in hello>"
    token_sha256 = "<hex SHA-256 of alice's operator bearer token>"
    max_computers = 8          # optional

Only hashes are kept.  Secrets and tokens are generated with at least 128
bits (``trapsandbox-ctl accounts add``), so a plain SHA-256 is enough, and a
secret or token presented is looked up by its hash in a dict: it is never
compared with the stored hashes one by one.

``load`` reads a file, or raises ``ConfigError`` with one line naming the file
and the problem.  ``add_account``/``remove_account`` rewrite the file's text
for ``trapsandbox-ctl`` and keep everything else in it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import tomllib
from collections.abc import Mapping
from typing import Any

import attrs

from trapsandbox.errors import ConfigError
from trapsandbox.limits import LOCAL_ACCOUNT

# An account name is a bare TOML key, short, and safe in a URL query and a metric label.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_HEX = re.compile(r"[0-9a-f]{64}\Z")
KEYS = frozenset({"secret_sha256", "token_sha256", "max_computers"})


def sha256_hex(text: str | bytes) -> str:
    """The lower-case hex SHA-256 of ``text``'s UTF-8 bytes."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


@attrs.frozen
class Account:
    name: str
    secret_sha256: str = attrs.field(repr=False)
    token_sha256: str = attrs.field(repr=False)
    # None: no limit.
    max_computers: int | None = None


@attrs.frozen
class Accounts:
    """The accounts of one file, by name and by the hash of their secret and token."""

    by_name: Mapping[str, Account] = attrs.field(factory=dict)
    by_secret: Mapping[str, Account] = attrs.field(factory=dict, repr=False)
    by_token: Mapping[str, Account] = attrs.field(factory=dict, repr=False)

    @classmethod
    def of(cls, accounts: list[Account]) -> Accounts:
        """Index ``accounts``; ``ValueError`` if two share a name, a secret or a token."""
        by_name: dict[str, Account] = {}
        by_secret: dict[str, Account] = {}
        by_token: dict[str, Account] = {}
        for account in accounts:
            for index, key, what in (
                (by_name, account.name, "name"),
                (by_secret, account.secret_sha256, "secret_sha256"),
                (by_token, account.token_sha256, "token_sha256"),
            ):
                other = index.get(key)
                if other is not None:
                    raise ValueError(
                        f"accounts {other.name} and {account.name} have the same {what}"
                    )
                index[key] = account
            if account.secret_sha256 in by_token or account.token_sha256 in by_secret:
                raise ValueError(f"account {account.name}: a secret is also a token")
        return cls(by_name, by_secret, by_token)

    def __len__(self) -> int:
        return len(self.by_name)


def _account(name: str, table: Any) -> Account:
    if not NAME.match(name):
        raise ValueError(f"account name {name!r} must be 1 to 64 of A-Z a-z 0-9 _ -")
    if name == LOCAL_ACCOUNT:
        raise ValueError(f"the account name {LOCAL_ACCOUNT!r} is the SANDBOX_PASSWORD's")
    if not isinstance(table, dict):
        raise ValueError(f"accounts.{name} must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ValueError(
            f"accounts.{name} has an unknown key {unknown[0]!r} (known: "
            + ", ".join(sorted(KEYS))
            + ")"
        )
    hashes = []
    for key in ("secret_sha256", "token_sha256"):
        value = table.get(key)
        if value is None:
            raise ValueError(f"accounts.{name} needs {key}")
        if not isinstance(value, str) or not _HEX.match(value):
            raise ValueError(f"accounts.{name}.{key} must be 64 lower-case hex digits (a SHA-256)")
        hashes.append(value)
    most = table.get("max_computers")
    if most is not None and (type(most) is not int or most < 1):
        raise ValueError(f"accounts.{name}.max_computers must be a whole number of at least 1")
    return Account(name, hashes[0], hashes[1], most)


def parse(text: str) -> Accounts:
    """The accounts in ``text``; ``ValueError`` saying what is wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"not TOML: {error}") from None
    unknown = sorted(set(document) - {"accounts"})
    if unknown:
        raise ValueError(f"unknown top-level key {unknown[0]!r} (only [accounts.NAME] tables)")
    tables = document.get("accounts", {})
    if not isinstance(tables, dict):
        raise ValueError("accounts must be a table of [accounts.NAME] tables")
    return Accounts.of([_account(name, table) for name, table in tables.items()])


def load(path: str, setting: str = "SANDBOX_ACCOUNTS_FILE") -> Accounts:
    """The accounts of the file at ``path``, or ``ConfigError`` in one line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise ConfigError(f"{setting} {path}: cannot read it: {error.strerror}") from None
    try:
        return parse(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{setting} {path}: not UTF-8 text") from None
    except ValueError as error:
        # tomllib's messages are one line; keep ours so.
        message = " ".join(str(error).split())
        raise ConfigError(f"{setting} {path}: {message}") from None


# -- Editing the file (trapsandbox-ctl accounts) ---------------------------------------------


def read_text(path: str) -> str:
    """The file's text, or "" if it does not exist yet."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _header(name: str) -> re.Pattern[str]:
    quoted = re.escape(name)
    return re.compile(
        rf"^[ \t]*\[[ \t]*accounts[ \t]*\.[ \t]*(?:{quoted}|\"{quoted}\"|'{quoted}')[ \t]*\]"
        r"[ \t]*(?:#.*)?$"
    )


def with_account(text: str, account: Account) -> str:
    """``text`` with ``account``'s table appended; ``ValueError`` if it cannot be."""
    accounts = parse(text)
    if account.name in accounts.by_name:
        raise ValueError(f"there is already an account {account.name}")
    table = (
        f"[accounts.{account.name}]\n"
        f'secret_sha256 = "{account.secret_sha256}"\n'
        f'token_sha256 = "{account.token_sha256}"\n'
    )
    if account.max_computers is not None:
        table += f"max_computers = {account.max_computers}\n"
    if text and not text.endswith("\n"):
        text += "\n"
    new = text + ("\n" if text.strip() else "") + table
    parse(new)  # the same checks as the gateway's (a duplicate secret, …)
    return new


def without_account(text: str, name: str) -> str:
    """``text`` without the ``[accounts.NAME]`` table; ``ValueError`` if it cannot be."""
    if name not in parse(text).by_name:
        raise ValueError(f"there is no account {name}")
    header = _header(name)
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    skipping = False
    for line in lines:
        stripped = line.lstrip()
        if header.match(line.rstrip("\r\n")):
            skipping = True
            continue
        if skipping and stripped.startswith("["):
            skipping = False
        if not skipping:
            kept.append(line)
    new = "".join(kept)
    if name in parse(new).by_name:
        raise ValueError(
            f"cannot remove {name}: it is not written as an [accounts.{name}] table; edit the "
            "file by hand"
        )
    return new


def write_text(path: str, text: str) -> None:
    """Replace the file at ``path`` with ``text``, mode 0600, keeping its owner if it can."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        before = os.stat(path)
    except FileNotFoundError:
        before = None
    fd, temporary = tempfile.mkstemp(prefix=".accounts-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o600)
        if before is not None:
            try:
                os.chown(temporary, before.st_uid, before.st_gid)
            except PermissionError:
                pass
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
