"""
Each asking computer's private opencode directory (SPEC §11).

opencode keeps one instance per ``directory`` query parameter, each with its
own MCP connections.  Every computer's sessions live in a directory of their
own under the ask directory (made and opened as ``trapsandbox.state`` says:
0700, ours, never through a symbolic link), whose instance is given a
``trapsandbox`` MCP server (``POST /mcp?directory=D``, the same name as the
operator's, so it replaces it there and the tools keep their names) whose
bearer token is the computer's ask token (``tokens``).  The block is written
to the directory's ``opencode.json``, which an instance reads when opencode
makes it (the first request naming the directory): a directory made just now
has no instance yet, so the file is all it needs; one that was there before
(the gateway restarted, or the computer's conversation was forgotten) may
have a live instance holding another token, which is given the block through
the API as well.  The operator's block (``GET /config``) is read once per
``limits.ASK_CONFIG_TTL`` seconds, not at every new computer.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import orjson
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.agent import MCP_NAME
from trapsandbox.opencode.client import OpencodeClient, opencode_error
from trapsandbox.opencode.tokens import AskTokens, Key
from trapsandbox.state import Unsafe, private_directory, write_private

log = Logger()


def directory_name(account_id: str, trapos_id: str) -> str:
    """
    A computer's ask directory: its number (for a reader of the folder) and a
    digest of the account and traposId, so neither can put a ``/`` or ``..``
    into the path.  Not a secret: the parent is 0700.
    """
    number = trapos_id.partition(":")[0]
    if not (number.isascii() and number.isdigit() and len(number) <= 16):
        number = "x"
    digest = hashlib.sha256(f"{account_id}\0{trapos_id}".encode()).hexdigest()[:16]
    return f"{number}-{digest}"


class AskDirectories:
    """The computers' directories under ``root``, and which have their MCP block."""

    def __init__(
        self, root: str, client: OpencodeClient, tokens: AskTokens, clock: IReactorTime
    ) -> None:
        # A private directory (``state.prepare``, at start).  opencode resolves a
        # relative directory against its own working directory: give it an absolute one.
        self.root = os.path.abspath(root)
        self._client = client
        self._tokens = tokens
        self._clock = clock
        self._scoped: set[Key] = set()  # computers whose instance has our MCP block
        self._config: tuple[float, Any] | None = None  # (when read, opencode's config)
        self._reading: list[Deferred] | None = None  # who waits for the read under way

    def forget(self, key: Key) -> None:
        """The computer's instance is to be given its block again (a new token) if it asks."""
        self._scoped.discard(key)

    async def prepare(self, key: Key) -> str:
        """
        The computer's ask directory, made or checked (``private_directory``), its
        opencode instance given a ``trapsandbox`` MCP block for this computer unless it
        has one already.
        """
        path = os.path.join(self.root, directory_name(*key))
        scoping = key not in self._scoped
        block = await self._block(key) if scoping else None
        made = not os.path.lexists(path)
        try:
            with private_directory(self.root, os.path.basename(path)) as fd:
                if block is not None:
                    write_private(fd, "opencode.json", orjson.dumps({"mcp": {MCP_NAME: block}}))
        except (Unsafe, OSError) as error:
            raise self._unsafe(path, error) from None
        if block is not None and not made:
            # A live instance may hold another block (the gateway restarted, or the
            # conversation was forgotten); a directory made just now has none yet, and the
            # instance opencode makes for it reads the file.
            await self._client.add_mcp(path, MCP_NAME, block)
        if scoping:
            self._scoped.add(key)
        return path

    async def _block(self, key: Key) -> dict[str, Any] | None:
        """The operator's ``trapsandbox`` block with this computer's token; None (and said
        in the log) when opencode has none."""
        config = await self._operator_config()
        servers = config.get("mcp") if isinstance(config, dict) else None
        server = servers.get(MCP_NAME) if isinstance(servers, dict) else None
        if not isinstance(server, dict) or not isinstance(server.get("url"), str):
            log.warn(
                "opencode has no {name!r} MCP server configured: asks get no tools "
                "(trapsandbox-ctl opencode-config prints the block)",
                name=MCP_NAME,
            )
            return None
        headers = server.get("headers") if isinstance(server.get("headers"), dict) else {}
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {self._tokens.token(key)}"
        return {
            "type": "remote",
            "url": server["url"],
            "oauth": False,
            "headers": headers,
            # Not the operator's: opencode cuts a tool call at it (limits.ASK_MCP_TIMEOUT_MS).
            "timeout": limits.ASK_MCP_TIMEOUT_MS,
        }

    async def _operator_config(self) -> Any:
        """opencode's own config (the operator's ``trapsandbox`` block), read at most once
        per ``limits.ASK_CONFIG_TTL`` seconds, and once for every ask that needs it
        meanwhile (a whole server's first asks at once made one read each)."""
        now = self._clock.seconds()
        if self._config is not None and now - self._config[0] < limits.ASK_CONFIG_TTL:
            return self._config[1]
        # Each ask waits on its own Deferred: one cancelled does not cancel the others' read.
        waiter: Deferred = Deferred()
        if self._reading is not None:
            self._reading.append(waiter)
        else:
            self._reading = [waiter]
            self._client.config().addBoth(self._read, now)
        return await waiter

    def _read(self, result: Any, when: float) -> None:
        waiters, self._reading = self._reading or [], None
        if isinstance(result, Failure):
            for waiter in waiters:
                waiter.errback(result)
            return
        self._config = (when, result)
        for waiter in waiters:
            waiter.callback(result)

    def _unsafe(self, path: str, error: Exception) -> GatewayError:
        reason = str(error) if isinstance(error, Unsafe) else error.strerror or str(error)
        log.error("the ask directory {path} is not usable: {reason}", path=path, reason=reason)
        return opencode_error(
            f"the gateway's ask directory for this computer is not usable ({cut(reason)}); "
            "the operator must remove or fix it"
        )
