"""
The routes on one computer: the computer as a sandbox (SPEC §9), its snapshots (§15),
its peripherals and turtle (§16).  Each is an operator's, its account resolved in one
place (``routing.on_computer``); a body is checked by ``validation``, an answer written by
``answers``.  Part of ``app.GatewayApp`` (its ``router``), which gives it ``_registry``,
``_sandbox`` and ``_requests``.

  The computer as a sandbox (SPEC §9, ``trapsandbox.computers.sandbox``), operators:
    POST /computers/<traposId>/execute     {command, args?, cwd?, timeoutMs?, maxOutputBytes?}
                                           -> NDJSON: {type: stdout_delta|stderr_delta, data}...
                                              then {type: result, exitCode, timedOut, ...}
                                              or {type: error, error, code}
    POST /computers/<traposId>/eval        {code, timeoutMs?} -> the eval answer
    POST /computers/<traposId>/read-file   {path, offset?, length?} -> {ok, content (base64),
                                              sizeBytes, encoding, offset, bytesRead}
    POST /computers/<traposId>/write-file  {path, content (base64)} -> {ok, bytesWritten,
                                              sizeBytes}
    POST /computers/<traposId>/list-files  {path} -> {ok, path, entries}
    POST /computers/<traposId>/delete-file {path} -> {ok, deleted}
    GET  /computers/<traposId>/screen      -> {ok, width, height, cursorX, cursorY, lines, ...}
    POST /computers/<traposId>/input       {events} -> {ok, queued} (SPEC §14)
    GET  /computers/<traposId>/screen/stream?maxFps=n
                                           -> text/event-stream: data: {type: screen, width,
                                              height, cursorX, cursorY, cursorBlink, rows,
                                              palette?} per frame (``computers.screen``)
  Snapshots (SPEC §15, ``web.snapshotcalls``; /operator carries them too), operators:
    GET  /computers/<traposId>/snapshots                 -> {ok, snapshots: [{id, created,
                                                            reason, files, bytes, ...}]}
    POST /computers/<traposId>/snapshots                 {} -> {ok, id, files, bytes, fetched}
    GET  /computers/<traposId>/snapshots/<id>/changes    -> {ok, snapshot, added, modified,
                                                            deleted, diffs}
    POST /computers/<traposId>/snapshots/<id>/restore    {} -> {ok, restored, before,
                                                            deleted, written}
  Peripherals and turtles (SPEC §16), operators:
    GET  /computers/<traposId>/peripherals               -> ``Sandbox.list_peripherals``
    POST /computers/<traposId>/peripherals/<name>/call   {method, args?}
                                                         -> ``Sandbox.call_peripheral``
    GET  /computers/<traposId>/peripherals/events?events=&timeoutMs=
                                                         -> text/event-stream of its events
    POST /computers/<traposId>/turtle                    {action, args?} -> ``Sandbox.turtle``
  Their failures are {ok: false, error: "<message>", code} with the status of
  ``errors.STATUS``; a caller leaving /execute cancels the run, and one
  leaving a stream the watch on the computer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from trapsandbox import limits
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.limits import MAX_REQUEST_TIMEOUT_MS
from trapsandbox.web import validation
from trapsandbox.web.answers import gateway_error, ok_body, plain_body, sandbox_failed
from trapsandbox.web.operator import OperatorRequests
from trapsandbox.web.routing import on_computer, router
from trapsandbox.web.snapshotcalls import SnapshotCalls
from trapsandbox.web.streaming import EventStream, OutputStream, ScreenStream
from trapsandbox.web.validation import read_body


def _encoded(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        **answer,
        "content": base64.b64encode(answer["content"]).decode("ascii"),
        "encoding": "base64",
    }


_EXECUTE = '{"command", "args"?, "cwd"?, "timeoutMs"?, "maxOutputBytes"?}'


class SandboxRoutes:
    """The routes on one computer, mixed into ``app.GatewayApp``."""

    _registry: Registry
    _sandbox: Sandbox
    _requests: OperatorRequests

    @router.route("/computers/<path:trapos_id>/execute", methods=["POST"])
    @on_computer
    def execute(self, request: IRequest, caller: Caller):
        try:
            body = validation.json_object(read_body(request), _EXECUTE)
            command = validation.string(body, "command")
            args = validation.strings(body, "args")
            cwd = validation.string(body, "cwd", required=False)
            timeout_ms = validation.number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS)
            max_output = validation.number(
                body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True
            )
        except GatewayError as error:
            return gateway_error(request, error)
        stream = OutputStream(request)
        d = self._sandbox.execute(
            caller,
            command,
            args,
            cwd,
            timeout_ms,
            max_output,
            on_output=stream.output,
        )
        if not d.called:
            stream.begin()  # it went out: from now on, failures are lines of the stream
        d.addCallbacks(stream.result, stream.failed)
        return d

    @router.route("/computers/<path:trapos_id>/eval", methods=["POST"])
    @on_computer
    def eval(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.eval(
                caller,
                validation.string(body, "code"),
                validation.number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS),
                validation.number(body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True),
            )

        # The answer has its own ok: false when the code failed, and is still a 200.
        return self._sandbox_call(request, '{"code", "timeoutMs"?}', call, ok=False)

    @router.route("/computers/<path:trapos_id>/read-file", methods=["POST"])
    @on_computer
    def read_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            validation.base64_encoding(body)
            offset = validation.offset(body, "offset")
            length = validation.number(body, "length", limits.MAX_FILE_BYTES, integer=True)
            return self._sandbox.read_file(
                caller,
                validation.string(body, "path"),
                offset,
                length,
            ).addCallback(_encoded)

        return self._sandbox_call(request, '{"path", "offset"?, "length"?}', call)

    @router.route("/computers/<path:trapos_id>/write-file", methods=["POST"])
    @on_computer
    def write_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            path = validation.string(body, "path")
            validation.base64_encoding(body)
            data = validation.base64_bytes(body, "content")
            return self._sandbox.write_file(caller, path, data)

        return self._sandbox_call(request, '{"path", "content", "encoding": "base64"}', call)

    @router.route("/computers/<path:trapos_id>/list-files", methods=["POST"])
    @on_computer
    def list_files(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.list_files(
                caller,
                validation.string(body, "path"),
            )

        return self._sandbox_call(request, '{"path"}', call)

    @router.route("/computers/<path:trapos_id>/delete-file", methods=["POST"])
    @on_computer
    def delete_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.delete_file(
                caller,
                validation.string(body, "path"),
            )

        return self._sandbox_call(request, '{"path"}', call)

    @router.route("/computers/<path:trapos_id>/screen", methods=["GET"])
    @on_computer
    def screen(self, request: IRequest, caller: Caller):
        d = self._sandbox.screen(caller)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    @router.route("/computers/<path:trapos_id>/input", methods=["POST"])
    @on_computer
    def input(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            events = validation.objects(body, "events", limits.MAX_INPUT_EVENTS)
            return self._sandbox.input(caller, events)

        return self._sandbox_call(request, '{"events": [{"char"}, {"key"}, ...]}', call)

    @router.route("/computers/<path:trapos_id>/screen/stream", methods=["GET"])
    @on_computer
    def screen_stream(self, request: IRequest, caller: Caller):
        try:
            max_fps = validation.query_number(request, b"maxFps", 1, 20)
        except GatewayError as error:
            return gateway_error(request, error)
        stream = ScreenStream(request, self._registry.streams.held(request))
        d = self._sandbox.watch_screen(caller, stream.frame, max_fps, stream.room)
        if not d.called:
            stream.begin()  # it went out: from now on, its end is an event of the stream
        # Klein cancels ``d`` when the caller leaves: the watch is cancelled on the computer.
        d.addBoth(stream.ended)
        return d

    # -- Snapshots (SPEC §15) ----------------------------------------------------------------
    # A label may hold a "/": the snapshot id is the last segments, the traposId the rest.

    @router.route("/computers/<path:trapos_id>/snapshots", methods=["GET"])
    @on_computer
    def snapshots(self, request: IRequest, caller: Caller):
        return self._snapshot_call(request, lambda s: s.list(caller))

    @router.route("/computers/<path:trapos_id>/snapshots", methods=["POST"])
    @on_computer
    def take_snapshot(self, request: IRequest, caller: Caller):
        return self._snapshot_call(request, lambda s: s.take(caller), body=True)

    @router.route("/computers/<path:trapos_id>/snapshots/<snapshot_id>/changes", methods=["GET"])
    @on_computer
    def snapshot_changes(self, request: IRequest, caller: Caller, snapshot_id: str):
        return self._snapshot_call(request, lambda s: s.changes(caller, snapshot_id))

    @router.route("/computers/<path:trapos_id>/snapshots/<snapshot_id>/restore", methods=["POST"])
    @on_computer
    def restore_snapshot(self, request: IRequest, caller: Caller, snapshot_id: str):
        return self._snapshot_call(request, lambda s: s.restore(caller, snapshot_id), body=True)

    def _snapshot_call(
        self, request: IRequest, call: Callable[[SnapshotCalls], Deferred], body: bool = False
    ):
        """
        A snapshot operation (``snapshotcalls``, whose answers ``/operator`` gives too):
        its body (if any) must be empty or a JSON object.
        """
        try:
            if body:
                raw = read_body(request)
                if raw.strip():
                    validation.json_object(raw, "{}")
        except GatewayError as error:
            return gateway_error(request, error)
        d = call(self._requests.snapshots)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    # -- Peripherals and turtles (SPEC §16) --------------------------------------------------

    @router.route("/computers/<path:trapos_id>/peripherals", methods=["GET"])
    @on_computer
    def peripherals(self, request: IRequest, caller: Caller):
        d = self._sandbox.list_peripherals(caller)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    @router.route("/computers/<path:trapos_id>/peripherals/<name>/call", methods=["POST"])
    @on_computer
    def call_peripheral(self, request: IRequest, caller: Caller, name: str):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.call_peripheral(
                caller,
                name,
                validation.string(body, "method"),
                validation.values(body, "args"),
            )

        return self._sandbox_call(request, '{"method", "args"?}', call)

    @router.route("/computers/<path:trapos_id>/peripherals/events", methods=["GET"])
    @on_computer
    def peripheral_events(self, request: IRequest, caller: Caller):
        try:
            events = validation.query_names(request, b"events")
            timeout_ms = validation.query_number(
                request, b"timeoutMs", 1, limits.MAX_PERIPHERAL_EVENTS_TIMEOUT_MS
            )
        except GatewayError as error:
            return gateway_error(request, error)
        stream = EventStream(request, self._registry.streams.held(request))
        d = self._sandbox.watch_peripheral_events(
            caller,
            stream.frame,
            events,
            timeout_ms,
        )
        if not d.called:
            stream.watch = d
            stream.begin()
        # Klein cancels ``d`` when the caller leaves: the watch is cancelled on the computer.
        d.addBoth(stream.ended)
        return d

    @router.route("/computers/<path:trapos_id>/turtle", methods=["POST"])
    @on_computer
    def turtle(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.turtle(
                caller,
                validation.string(body, "action"),
                validation.values(body, "args"),
            )

        return self._sandbox_call(request, '{"action", "args"?}', call)

    def _sandbox_call(
        self,
        request: IRequest,
        shape: str,
        call: Callable[[dict[str, Any]], Deferred],
        ok: bool = True,
    ):
        try:
            d = call(validation.json_object(read_body(request), shape))
        except GatewayError as error:
            return gateway_error(request, error)
        d.addCallbacks(ok_body if ok else plain_body, sandbox_failed, (request,), None, (request,))
        return d
