"""
The tools' bodies (SPEC §10): what each tool asks of the computer through the
section 9 operations (``Sandbox``), and how its answer reads to a model.

A tool gets the session ``resolve`` chose and its arguments, and returns its
``CallToolResult`` with the call's outcome; every failure the model can act on
is a ``GatewayError``.  A call is bounded by ``MCP_CALL_TIMEOUT`` (opencode cuts
a call that sends nothing for about a minute), unless its client takes
progress (SPEC §17): then a run lasts its own ``timeoutSeconds`` (up to
``MCP_PROGRESS_MAX_RUN_SECONDS``) and reports as it goes (``Reporter``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall, deferLater

from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError
from trapsandbox.mcp import arguments as check
from trapsandbox.mcp.jsonrpc import Progress
from trapsandbox.mcp.resolve import several_accounts, split
from trapsandbox.mcp.results import LUA_ERROR, result
from trapsandbox.mcp.text import ADVICE, gateway_error_text, output_text

Answer = tuple[dict[str, Any], str]  # the CallToolResult and the call's outcome
# A log line for the client (``jsonrpc.Call.log``): level, data, logger.
Log = Callable[..., None]


def _no_log(level: str, data: Any, logger: str = "") -> None:
    pass


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


class Reporter:
    """
    A run's progress while it goes on: each ``MCP_PROGRESS_INTERVAL`` when it
    printed something meanwhile, else each ``MCP_PROGRESS_HEARTBEAT`` (a quiet
    run must still reset the client's clock).  ``progress`` is the seconds
    the run has gone on, which grows with each report as MCP wants (output
    bytes would not during a quiet spell); ``total`` its ``timeoutSeconds``;
    the message, its output so far in bytes and its latest line.
    """

    def __init__(self, progress: Progress, clock: IReactorTime, seconds: float) -> None:
        self._progress = progress
        self._clock = clock
        self._seconds = seconds
        self._started = clock.seconds()
        self._reported = self._started
        self._bytes = 0
        self._line = ""
        self._heard = False
        self._loop = LoopingCall(self._tick)
        self._loop.clock = clock

    def start(self) -> None:
        self._loop.start(limits.MCP_PROGRESS_INTERVAL, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def heard(self, data: str) -> None:
        self._bytes += len(data.encode("utf-8", "surrogatepass"))
        lines = [line for line in data.splitlines() if line.strip()]
        if lines:
            self._line = lines[-1]
        self._heard = True

    def _tick(self) -> None:
        now = self._clock.seconds()
        if not self._heard and now - self._reported < limits.MCP_PROGRESS_HEARTBEAT:
            return
        self._heard = False
        self._reported = now
        message = f"{self._bytes} bytes of output"
        if self._line:
            message += ": " + wire.cut(self._line)
        self._progress(round(now - self._started, 3), self._seconds, message)


class Tools:
    """The tools that act on one computer; ``call`` runs one by name."""

    def __init__(self, sandbox: Sandbox, clock: IReactorTime) -> None:
        self._sandbox = sandbox
        self._clock = clock
        self._tools: dict[str, Callable[..., Coroutine[Any, Any, Answer]]]
        self._tools = {
            "run_command": self._run_command,
            "run_lua": self._run_lua,
            "list_files": self._list_files,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "delete_file": self._delete_file,
            "read_screen": self._read_screen,
            "send_input": self._send_input,
            "list_peripherals": self._list_peripherals,
            "call_peripheral": self._call_peripheral,
            "turtle": self._turtle,
        }

    async def call(
        self,
        name: str,
        session: Session,
        caller: Caller,
        arguments: dict[str, Any],
        progress: Progress | None = None,
        log: Log = _no_log,
    ) -> Answer:
        """
        Tool ``name`` on ``session``, its requests ``caller``'s (aimed at it), or a
        ``GatewayError`` for the model;
        ``progress``: where a run reports while it goes on (None: the client
        takes no progress, so the call keeps within ``MCP_CALL_TIMEOUT``);
        ``log``: where a run's stderr goes as it comes, as log lines.
        """
        if name in ("run_command", "run_lua"):
            return await self._tools[name](session, caller, arguments, progress, log)
        return await self._tools[name](session, caller, arguments)

    async def _answer(
        self, session: Session, d: Deferred, bound: float = limits.MCP_CALL_TIMEOUT
    ) -> dict[str, Any]:
        """The answer ``d`` fires with within ``bound``, or a ``GatewayError`` for the model."""
        try:
            # Cancelling the request cancels a run on the computer.
            return await d.addTimeout(bound, self._clock)
        except GatewayError as error:
            raise GatewayError(error.code, gateway_error_text(error, session)) from None
        except TimeoutError:
            raise GatewayError(
                errors.TIMEOUT,
                f"{session.trapos_id} did not finish within {bound:g} s; "
                "the request was cancelled on it. " + ADVICE[errors.TIMEOUT],
            ) from None

    def _seconds(self, arguments: dict[str, Any], progress: Progress | None) -> float:
        """How long a run may last: longer when its progress reaches the client."""
        if progress is None:
            return check.run_seconds(arguments, limits.MCP_MAX_RUN_SECONDS)
        return check.run_seconds(arguments, limits.MCP_PROGRESS_MAX_RUN_SECONDS)

    async def _run(
        self,
        session: Session,
        start: Callable[[float, Callable[[str, str], None]], Deferred],
        seconds: float,
        progress: Progress | None,
        log: Log = _no_log,
    ) -> dict[str, Any]:
        """A run's answer; past the call's bound, what it printed so far and ``timedOut``."""
        heard: dict[str, list[str]] = {"stdout_delta": [], "stderr_delta": []}
        reporter = None if progress is None else Reporter(progress, self._clock, seconds)

        def listen(kind: str, data: str) -> None:
            heard[kind].append(data)
            if reporter is not None:
                reporter.heard(data)
            if kind == "stderr_delta":
                log("warning", {"computer": session.trapos_id, "stderr": data}, "computer")

        d = start(round(seconds * 1000), listen)
        if reporter is None:
            bound = limits.MCP_CALL_TIMEOUT
        else:
            bound = seconds + limits.MCP_CALL_MARGIN
            reporter.start()
        try:
            return await self._answer(session, d, bound)
        except GatewayError as error:
            if error.code != errors.TIMEOUT or not any(heard.values()):
                raise
            return {
                "timedOut": True,
                "stdout": "".join(heard["stdout_delta"]),
                "stderr": "".join(heard["stderr_delta"]),
                "answered": False,
            }
        finally:
            if reporter is not None:
                reporter.stop()

    async def _run_command(
        self,
        session: Session,
        caller: Caller,
        arguments: dict[str, Any],
        progress: Progress | None = None,
        log: Log = _no_log,
    ) -> Answer:
        command = check.string(arguments, "command")
        args = check.strings(arguments, "args")
        seconds = self._seconds(arguments, progress)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.execute(
                caller,
                command,
                args,
                timeout_ms=ms,
                on_output=listen,
            ),
            seconds,
            progress,
            log,
        )
        code = answer.get("exitCode")
        header = f"{command} on {session.trapos_id}: exit code {code if code is not None else '?'}"
        return result(output_text(answer, header, seconds), answer), "ok"

    async def _run_lua(
        self,
        session: Session,
        caller: Caller,
        arguments: dict[str, Any],
        progress: Progress | None = None,
        log: Log = _no_log,
    ) -> Answer:
        code = check.string(arguments, "code")
        seconds = self._seconds(arguments, progress)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.eval(
                caller,
                code,
                timeout_ms=ms,
                on_output=listen,
            ),
            seconds,
            progress,
            log,
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

    async def _list_files(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.list_files(caller, path),
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

    async def _read_file(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.read_file(caller, path),
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

    async def _write_file(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        path = check.string(arguments, "path")
        data = check.file_content(arguments)
        answer = await self._answer(
            session,
            self._sandbox.write_file(caller, path, data),
        )
        text = (
            f"Wrote {answer.get('bytesWritten', len(data))} bytes to {path} on {session.trapos_id}."
        )
        return result(text, answer), "ok"

    async def _delete_file(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        path = check.string(arguments, "path")
        answer = await self._answer(
            session,
            self._sandbox.delete_file(caller, path),
        )
        if answer.get("deleted"):
            text = f"Deleted {path} on {session.trapos_id}."
        else:
            text = f"Nothing was deleted: {path} does not exist on {session.trapos_id}."
        return result(text, answer), "ok"

    async def _read_screen(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        answer = await self._answer(session, self._sandbox.screen(caller))
        return result(_screen_text(session, answer), answer), "ok"

    async def _send_input(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        events = check.input_events(arguments)
        answer = await self._answer(
            session,
            self._sandbox.input(caller, events),
        )
        queued = answer.get("queued", len(events))
        sent = f"Sent {queued} input events to {session.trapos_id}."
        # Give the program a moment to draw what the input did, then look.
        await deferLater(self._clock, limits.SEND_INPUT_SETTLE)
        try:
            screen = await self._answer(session, self._sandbox.screen(caller))
        except GatewayError as error:
            text = f"{sent} Its screen cannot be read now, so the effect is not shown: {error}"
            return result(text, {"queued": queued}), "ok"
        text = f"{sent} {_screen_text(session, screen)}"
        return result(text, {"queued": queued, "screen": screen}), "ok"

    async def _list_peripherals(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        answer = await self._answer(
            session,
            self._sandbox.list_peripherals(caller),
        )
        found = answer.get("peripherals") if isinstance(answer.get("peripherals"), list) else []
        lines = []
        for each in found:
            if isinstance(each, dict):
                types = ", ".join(str(t) for t in each.get("types") or [])
                methods = ", ".join(str(m) for m in each.get("methods") or [])
                lines.append(f"- {each.get('name')} ({types}): {methods}")
        if lines:
            text = f"Peripherals of {session.trapos_id}:\n" + "\n".join(lines)
        else:
            text = f"No peripheral is attached to {session.trapos_id}."
        return result(text, answer), "ok"

    async def _call_peripheral(
        self, session: Session, caller: Caller, arguments: dict[str, Any]
    ) -> Answer:
        name = check.string(arguments, "name")
        method = check.string(arguments, "method")
        args = check.values(arguments, "args")
        answer = await self._answer(
            session,
            self._sandbox.call_peripheral(
                caller,
                name,
                method,
                args,
            ),
        )
        text = f"{name}.{method} on {session.trapos_id} returned: {_values(answer)}"
        return result(text, answer), "ok"

    async def _turtle(self, session: Session, caller: Caller, arguments: dict[str, Any]) -> Answer:
        action = check.string(arguments, "action")
        args = check.values(arguments, "args")
        answer = await self._answer(
            session,
            self._sandbox.turtle(caller, action, args),
        )
        text = (
            f"turtle.{action} on {session.trapos_id} returned: {_values(answer)}; "
            f"fuel {answer.get('fuel')}, slot {answer.get('selected')} selected."
        )
        return result(text, answer), "ok"


def _values(answer: dict[str, Any]) -> str:
    """An answer's ``returns`` as JSON text, or "nothing"."""
    returns = answer.get("returns")
    if not isinstance(returns, list) or not returns:
        return "nothing"
    return ", ".join(orjson.dumps(value).decode() for value in returns)


def _screen_text(session: Session, answer: dict[str, Any]) -> str:
    """A ``screen`` answer as a model reads it: a header, then the lines."""
    lines = answer.get("lines") if isinstance(answer.get("lines"), list) else []
    shown = "\n".join(str(line).rstrip() for line in lines)
    header = (
        f"The screen of {session.trapos_id} ({answer.get('width')}x{answer.get('height')}, "
        f"cursor at column {answer.get('cursorX')}, line {answer.get('cursorY')}):"
    )
    return f"{header}\n{shown}"
