"""
The tools' bodies (SPEC §10): what each tool asks of the computer through the
section 9 operations (``Sandbox``), and how its answer reads to a model.

A tool gets the session ``resolve`` chose and its arguments, and returns its
``CallToolResult`` with the call's outcome; every failure the model can act on
is a ``ToolError``.  A call is bounded by ``MCP_CALL_TIMEOUT`` (opencode cuts
a call that sends nothing for about a minute); a run's output is heard as it
comes (``Tools._run``), which is where progress would be reported.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from trapsandbox import limits
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Session
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.wire import GatewayError
from trapsandbox.mcp import arguments as check
from trapsandbox.mcp.resolve import several_accounts, split
from trapsandbox.mcp.results import LUA_ERROR, ToolError, result
from trapsandbox.mcp.text import ADVICE, gateway_error_text, output_text

Answer = tuple[dict[str, Any], str]  # the CallToolResult and the call's outcome


def list_computers(sessions: list[Any]) -> dict[str, Any]:
    """``list_computers``: the computers ``resolve.computers`` found."""
    every = several_accounts(sessions)
    listed = []
    lines = []
    for session in sessions:
        number, label = split(session.trapos_id)
        allowed = sorted(session.capabilities)
        listed.append(
            {
                "traposId": session.trapos_id,
                "id": number,
                "label": label or None,
                "capabilities": allowed,
                "version": session.version,
                "accountId": session.account_id,
            }
        )
        named = f'label "{label}"' if label else "no label"
        if every:
            named += f", account {session.account_id}"
        lines.append(
            f"- {session.trapos_id} (id {number}, {named}); allowed: "
            + (", ".join(allowed) if allowed else 'nothing (the player can run "sandbox allow …")')
        )
    if not sessions:
        text = (
            "No computer is connected. A computer connects once the trapsandbox client "
            "is installed and running on it."
        )
    else:
        count = "1 computer" if len(sessions) == 1 else f"{len(sessions)} computers"
        text = f"{count} connected:\n" + "\n".join(lines)
    return result(text, {"computers": listed})


class Tools:
    """The tools that act on one computer; ``call`` runs one by name."""

    def __init__(self, sandbox: Sandbox, clock: IReactorTime) -> None:
        self._sandbox = sandbox
        self._clock = clock
        self._tools: dict[str, Callable[[Session, dict[str, Any]], Coroutine[Any, Any, Answer]]]
        self._tools = {
            "run_command": self._run_command,
            "run_lua": self._run_lua,
            "list_files": self._list_files,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "delete_file": self._delete_file,
            "read_screen": self._read_screen,
            "send_input": self._send_input,
        }

    async def call(self, name: str, session: Session, arguments: dict[str, Any]) -> Answer:
        """Tool ``name`` on ``session``, or a ``ToolError`` for the model."""
        return await self._tools[name](session, arguments)

    def _bounded(self, d: Deferred) -> Deferred:
        # Cancelling the request cancels a run on the computer.
        return d.addTimeout(limits.MCP_CALL_TIMEOUT, self._clock)

    async def _answer(self, session: Session, d: Deferred) -> dict[str, Any]:
        """The answer ``d`` fires with, or a ``ToolError`` for the model."""
        try:
            return await self._bounded(d)
        except GatewayError as error:
            raise ToolError(error.code, gateway_error_text(error, session)) from None
        except TimeoutError:
            raise ToolError(
                wire.TIMEOUT,
                f"{session.trapos_id} did not finish within {limits.MCP_CALL_TIMEOUT:g} s; "
                "the request was cancelled on it. " + ADVICE[wire.TIMEOUT],
            ) from None

    async def _run(
        self,
        session: Session,
        start: Callable[[float, Callable[[str, str], None]], Deferred],
        seconds: float,
    ) -> dict[str, Any]:
        """A run's answer; past the call's bound, what it printed so far and ``timedOut``."""
        heard: dict[str, list[str]] = {"stdout_delta": [], "stderr_delta": []}

        def listen(kind: str, data: str) -> None:
            heard[kind].append(data)

        d = start(round(seconds * 1000), listen)
        try:
            return await self._answer(session, d)
        except ToolError as error:
            if error.outcome != wire.TIMEOUT or not any(heard.values()):
                raise
            return {
                "timedOut": True,
                "stdout": "".join(heard["stdout_delta"]),
                "stderr": "".join(heard["stderr_delta"]),
                "answered": False,
            }

    async def _run_command(self, session: Session, arguments: dict[str, Any]) -> Answer:
        command = check.string(arguments, "command")
        args = check.strings(arguments, "args")
        seconds = check.run_seconds(arguments)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.execute(
                session.trapos_id,
                command,
                args,
                timeout_ms=ms,
                on_output=listen,
                account_id=session.account_id,
            ),
            seconds,
        )
        code = answer.get("exitCode")
        header = f"{command} on {session.trapos_id}: exit code {code if code is not None else '?'}"
        return result(output_text(answer, header, seconds), answer), "ok"

    async def _run_lua(self, session: Session, arguments: dict[str, Any]) -> Answer:
        code = check.string(arguments, "code")
        seconds = check.run_seconds(arguments)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.eval(
                session.trapos_id,
                code,
                timeout_ms=ms,
                on_output=listen,
                account_id=session.account_id,
            ),
            seconds,
        )
        returns = answer.get("returns")
        if answer.get("ok") is False:
            error = answer.get("error") or "the code failed"
            header = f"The Lua code failed on {session.trapos_id}: {error}"
            text = output_text({**answer, "stderr": None}, header, seconds)
            return result(text, answer, error=True), LUA_ERROR
        if isinstance(returns, list) and returns:
            header = "Returned: " + ", ".join(str(value) for value in returns)
        elif answer.get("timedOut"):
            header = f"The Lua code on {session.trapos_id} did not finish."
        else:
            header = "Returned nothing."
        return result(output_text(answer, header, seconds), answer), "ok"

    async def _list_files(self, session: Session, arguments: dict[str, Any]) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.list_files(session.trapos_id, path, account_id=session.account_id),
        )
        entries = answer.get("entries") if isinstance(answer.get("entries"), list) else []
        lines = []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            name = entry.get("name")
            if entry.get("type") == "dir":
                line = f"{name}/"
            else:
                line = f"{name}  {entry.get('size', '?')} bytes"
            if entry.get("readOnly"):
                line += "  (read-only)"
            lines.append(line)
        shown = answer.get("path", path)
        if lines:
            text = f"{shown} on {session.trapos_id}:\n" + "\n".join(lines)
        else:
            text = f"{shown} on {session.trapos_id} is empty."
        return result(text, answer), "ok"

    async def _read_file(self, session: Session, arguments: dict[str, Any]) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.read_file(session.trapos_id, path, account_id=session.account_id),
        )
        content: bytes = answer["content"]
        try:
            text, encoding = content.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(content).decode("ascii"), "base64"
        size = answer.get("sizeBytes", len(content))
        what = "UTF-8 text" if encoding == "utf-8" else "not UTF-8, so in base64"
        header = f"{path} on {session.trapos_id}: {size} bytes, {what}"
        if len(content) < size:
            header += f" (only the first {len(content)} bytes)"
        structured = {**answer, "path": path, "content": text, "encoding": encoding}
        return result(f"{header}:\n{text}", structured), "ok"

    async def _write_file(self, session: Session, arguments: dict[str, Any]) -> Answer:
        path = check.string(arguments, "path")
        data = check.file_content(arguments)
        answer = await self._answer(
            session,
            self._sandbox.write_file(session.trapos_id, path, data, account_id=session.account_id),
        )
        text = (
            f"Wrote {answer.get('bytesWritten', len(data))} bytes to {path} on {session.trapos_id}."
        )
        return result(text, answer), "ok"

    async def _delete_file(self, session: Session, arguments: dict[str, Any]) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.delete_file(session.trapos_id, path, account_id=session.account_id),
        )
        if answer.get("deleted"):
            text = f"Deleted {path} on {session.trapos_id}."
        else:
            text = f"Nothing was deleted: {path} does not exist on {session.trapos_id}."
        return result(text, answer), "ok"

    async def _read_screen(self, session: Session, arguments: dict[str, Any]) -> Answer:
        answer = await self._answer(
            session, self._sandbox.screen(session.trapos_id, account_id=session.account_id)
        )
        return result(_screen_text(session, answer), answer), "ok"

    async def _send_input(self, session: Session, arguments: dict[str, Any]) -> Answer:
        events = check.input_events(arguments)
        answer = await self._answer(
            session,
            self._sandbox.input(session.trapos_id, events, account_id=session.account_id),
        )
        queued = answer.get("queued", len(events))
        sent = f"Sent {queued} input events to {session.trapos_id}."
        # Give the program a moment to draw what the input did, then look.
        await deferLater(self._clock, limits.SEND_INPUT_SETTLE)
        try:
            screen = await self._answer(
                session, self._sandbox.screen(session.trapos_id, account_id=session.account_id)
            )
        except ToolError as error:
            text = f"{sent} Its screen cannot be read now, so the effect is not shown: {error}"
            return result(text, {"queued": queued}), "ok"
        text = f"{sent} {_screen_text(session, screen)}"
        return result(text, {"queued": queued, "screen": screen}), "ok"


def _screen_text(session: Session, answer: dict[str, Any]) -> str:
    """A ``screen`` answer as a model reads it: a header, then the lines."""
    lines = answer.get("lines") if isinstance(answer.get("lines"), list) else []
    shown = "\n".join(str(line).rstrip() for line in lines)
    header = (
        f"The screen of {session.trapos_id} ({answer.get('width')}x{answer.get('height')}, "
        f"cursor at column {answer.get('cursorX')}, line {answer.get('cursorY')}):"
    )
    return f"{header}\n{shown}"
