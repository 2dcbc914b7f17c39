"""
The wire format: one JSON object per WebSocket text message.

    computer -> gateway
      computer_request   {traposSenderId, messageId, type, payload}
      computer_response  {traposSenderId, messageId, type, ok, payload?, error?, partial?}
    gateway -> computer
      gateway_request    {traposReceiverId, messageId, type, payload}
      gateway_response   {traposReceiverId, messageId, type, ok, payload?, error?, partial?}

A response with ``partial: true`` is an interim message (output so far) for
a request that is still running; exactly one final response ends it.

``decode`` turns any bytes into one of the four frame classes or an
``Invalid``; it never raises.  ``encode`` turns a frame into bytes for
``sendMessage``.  Field names are snake_case here and camelCase on the wire.
"""

from __future__ import annotations

import random
import re
from typing import Any

import attrs
import orjson
from cattrs import ClassValidationError, transform_error
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.orjson import make_converter
from cattrs.v import format_exception

from trapsandbox.errors import FORBIDDEN, NOT_CONNECTED, Error, GatewayError
from trapsandbox.limits import MAX_ID_LENGTH, MAX_LABEL_LENGTH, MAX_TYPE_LENGTH

# What a computer's owner can allow (the Lua setting sandbox.allow), and the
# capability each gateway -> computer request type needs.  ping and cancel need none.
CAPABILITIES = ("exec", "eval", "fs.read", "fs.write", "screen", "input", "peripheral", "turtle")
CAPABILITY_OF = {
    "exec": "exec",
    "eval": "eval",
    "list_files": "fs.read",
    "read_file": "fs.read",
    "write_file": "fs.write",
    "write_files": "fs.write",
    "delete_file": "fs.write",
    "move_file": "fs.write",
    "make_folder": "fs.write",
    "screen": "screen",
    "screen_watch": "screen",
    "input": "input",
    "snapshot_list": "fs.read",
    "list_peripherals": "peripheral",
    "call_peripheral": "peripheral",
    "peripheral_events": "peripheral",
    "turtle": "turtle",
}
# What a client may announce in hello's ``features`` (docs/protocol.md): a temporary file of
# its own per write (``part.writeId``), the ``move_file`` and ``make_folder`` requests
# (checked and done in one step on the computer), file parts as binary messages and several
# whole files in one (``computers.parts``).  Others are ignored.
WRITE_ID, MOVE_FILE, MAKE_FOLDER = "write_id", "move_file", "make_folder"
BINARY_PARTS, WRITE_FILES = "binary_parts", "write_files"
FEATURES = frozenset({WRITE_ID, MOVE_FILE, MAKE_FOLDER, BINARY_PARTS, WRITE_FILES})
# What a client needs to have announced to be sent write_files.
WRITES_IN_BATCHES = frozenset({BINARY_PARTS, WRITE_FILES})
# Requests to computers with a metrics label of their own (operators may send any type).
REQUEST_TYPES = frozenset({"ping", "cancel", *CAPABILITY_OF})
# Request types that run on the computer until they end or are cancelled
# (with a ``cancel {messageId}`` request), streaming partial responses.
STREAMING = frozenset({"exec", "eval", "screen_watch", "peripheral_events"})
# Computer -> gateway request types answered with partial responses first.
COMPUTER_STREAMING = frozenset({"ask"})

# Close codes.
CLOSE_NORMAL = 1000
CLOSE_REPLACED = 4000
CLOSE_UNAUTHORIZED = 4001
CLOSE_HELLO_TIMEOUT = 4002
CLOSE_THROTTLED = 4003  # too many failed hellos from this address
# Its account already has its max_computers connected (SPEC §12): refused like a flood.
CLOSE_TOO_MANY_COMPUTERS = 4003
CLOSE_STALLED = 4004  # the computer stopped reading what we send

_TRAPOS_ID = re.compile(rf"(0|[1-9][0-9]{{0,15}}):([^\x00-\x1f\x7f]{{0,{MAX_LABEL_LENGTH}}})\Z")


# Values from outside (a traposId, a tool's ``computer``, a path, a type) are cut
# to this many characters wherever they are logged or echoed in an error (SPEC §4).
ECHO_LIMIT = 200


def cut(value: object, limit: int = ECHO_LIMIT) -> str:
    """``value`` as text for a log line or an error message, at most ``limit`` characters."""
    text = value if type(value) is str else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}\u2026"


def is_trapos_id(value: object) -> bool:
    """``"<computerId>:<label>"``, the label possibly empty."""
    return isinstance(value, str) and _TRAPOS_ID.match(value) is not None


def _as_object(value: object) -> dict[str, Any]:
    # CraftOS may send ``[]`` for an empty table; anything not an object is ``{}``.
    return value if type(value) is dict else {}


def _as_optional_object(value: object) -> dict[str, Any] | None:
    return None if value is None else _as_object(value)


def _bounded(limit: int):
    def check(instance, attribute, value):
        if not value or len(value) > limit:
            raise ValueError(f"{_camel(attribute.name)} must be 1 to {limit} characters")

    return check


def _id():
    return attrs.field(validator=_bounded(MAX_ID_LENGTH))


def _type():
    return attrs.field(validator=_bounded(MAX_TYPE_LENGTH))


def not_allowed(trapos_id: str, capability: str) -> GatewayError:
    """A request its computer's owner has not allowed, and the command that allows it."""
    return GatewayError(
        FORBIDDEN,
        f"computer {trapos_id} has not allowed {capability}: on it, run "
        f'"sandbox allow {capability}"',
    )


def not_connected(trapos_id: str) -> GatewayError:
    """
    A computer that is not connected, whoever asked: another account's computer answers
    exactly like this (SPEC §12), so every surface uses this one.
    """
    return GatewayError(NOT_CONNECTED, f"{cut(trapos_id)} is not connected")


@attrs.frozen
class ComputerRequest:
    trapos_sender_id: str = _id()
    message_id: str = _id()
    type: str = _type()
    payload: dict[str, Any] = attrs.field(factory=dict, converter=_as_object)


@attrs.frozen
class ComputerResponse:
    trapos_sender_id: str = _id()
    message_id: str = _id()
    type: str = _type()
    ok: bool = attrs.field()
    payload: dict[str, Any] | None = attrs.field(default=None, converter=_as_optional_object)
    error: Error | None = None
    partial: bool | None = None


@attrs.frozen
class GatewayRequest:
    trapos_receiver_id: str = _id()
    message_id: str = _id()
    type: str = _type()
    payload: dict[str, Any] = attrs.field(factory=dict, converter=_as_object)


@attrs.frozen
class GatewayResponse:
    trapos_receiver_id: str = _id()
    message_id: str = _id()
    type: str = _type()
    ok: bool = attrs.field()
    payload: dict[str, Any] | None = attrs.field(default=None, converter=_as_optional_object)
    error: Error | None = None
    partial: bool | None = None


Frame = ComputerRequest | ComputerResponse | GatewayRequest | GatewayResponse

EVENTS: dict[str, type] = {
    "computer_request": ComputerRequest,
    "computer_response": ComputerResponse,
    "gateway_request": GatewayRequest,
    "gateway_response": GatewayResponse,
}
_EVENT_OF = {cls: name for name, cls in EVENTS.items()}


@attrs.frozen
class Invalid:
    """
    A message that is not a valid frame.  ``message_id`` and ``type`` are set
    when the message carried usable ones, so a request can still be answered
    with ``bad_request``.
    """

    reason: str
    event: str | None = None
    message_id: str | None = None
    type: str | None = None

    @property
    def answerable(self) -> bool:
        return self.message_id is not None and self.type is not None


# What the metrics count a received message as, by its class (``Metrics.frame_kinds``).
FRAME_KINDS: dict[str, type] = {**EVENTS, "invalid": Invalid}


@attrs.frozen
class Hello:
    """The payload of a ``hello`` request."""

    trapos_id: str = attrs.field()
    secret: str | None = None
    # Shown in logs and /computers: bounded.
    version: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_bounded(MAX_TYPE_LENGTH))
    )
    capabilities: list[str] = attrs.field(factory=list)
    # What the client does beyond the first protocol (``FEATURES``); an older one sends none.
    features: list[str] = attrs.field(factory=list)
    # The player stopped the agent there (SPEC §16), and the computer's words saying how to
    # resume; a client older than the stop sends neither.
    stopped: bool = False
    stop_message: str | None = None

    @trapos_id.validator
    def _check_trapos_id(self, attribute, value):
        if not is_trapos_id(value):
            raise ValueError(
                "traposId must be '<computerId>:<label>' with a label of at most "
                f"{MAX_LABEL_LENGTH} characters"
            )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _strict(kind: type):
    def structure(value, _):
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}")
        return value

    return structure


def string_list(value: object) -> list[str]:
    """A list of strings; ``{}`` (CraftOS's empty table) is an empty one.  Raises ``TypeError``."""
    if type(value) is dict and not value:
        return []
    if type(value) is not list or any(type(item) is not str for item in value):
        raise TypeError("expected a list of strings")
    return value


def _strings(value, _):
    return string_list(value)


def _make_converter():
    converter = make_converter()
    # cattrs would turn 3 into "3" and "no" into True; the wire is strict.
    converter.register_structure_hook(str, _strict(str))
    converter.register_structure_hook(bool, _strict(bool))
    converter.register_structure_hook_func(lambda kind: kind == list[str], _strings)
    # Payloads are coerced by the attrs converter, not structured.
    converter.register_structure_hook_func(
        lambda kind: kind in (dict[str, Any], dict[str, Any] | None), lambda value, _: value
    )
    for cls in (*EVENTS.values(), Error, Hello):
        renames = {
            field.name: override(rename=_camel(field.name), omit_if_default=field.default is None)
            for field in attrs.fields(cls)
        }
        converter.register_structure_hook(cls, make_dict_structure_fn(cls, converter, **renames))
        converter.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, converter, **renames)
        )
    return converter


converter = _make_converter()

_STRUCTURE_ERRORS = (ClassValidationError, ValueError, TypeError, KeyError, AttributeError)


def _format(error: BaseException, kind: type | None) -> str:
    # Our own validators' messages say exactly what is wrong.
    if type(error) is ValueError and error.args:
        return str(error)
    return format_exception(error, kind)


def _describe(error: Exception, path: str) -> str:
    if isinstance(error, ClassValidationError):
        messages = transform_error(error, path=path, format_exception=_format)
        # Paths name attributes; say the wire's names.
        return re.sub(r"\.(\w+)", lambda m: "." + _camel(m.group(1)), "; ".join(messages))
    return str(error) or type(error).__name__


def _usable(value: object, limit: int) -> str | None:
    if type(value) is str and 0 < len(value) <= limit:
        return value
    return None


def decode(data: bytes | str) -> Frame | Invalid:
    """Decode one message; never raises."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        return Invalid(f"not JSON: {error}")
    if type(obj) is not dict:
        return Invalid(f"not a JSON object but {type(obj).__name__}")
    event = obj.get("event")
    if event == "computer_response":
        frame = _plain_response(obj)
        if frame is not None:
            return frame
    cls = EVENTS.get(event) if type(event) is str else None
    if cls is None:
        return Invalid("unknown event")
    return structure(obj, cls)


def _plain_response(obj: dict[str, Any]) -> ComputerResponse | None:
    """
    The common ``computer_response`` (no error object) built directly, as
    ``structure`` would build it (a hypothesis test pins that); None for
    anything else, which ``structure`` then reads or explains.
    """
    sender = obj.get("traposSenderId")
    message_id = obj.get("messageId")
    kind = obj.get("type")
    ok = obj.get("ok")
    partial = obj.get("partial")
    if (
        type(sender) is str
        and 0 < len(sender) <= MAX_ID_LENGTH
        and type(message_id) is str
        and 0 < len(message_id) <= MAX_ID_LENGTH
        and type(kind) is str
        and 0 < len(kind) <= MAX_TYPE_LENGTH
        and type(ok) is bool
        and obj.get("error") is None
        and (partial is None or type(partial) is bool)
    ):
        return ComputerResponse(sender, message_id, kind, ok, obj.get("payload"), None, partial)
    return None


def structure(obj: dict[str, Any], cls: type) -> Frame | Invalid:
    """``obj`` as a frame of ``cls`` through cattrs, or why it is not one."""
    event = obj.get("event")
    try:
        return converter.structure(obj, cls)
    except _STRUCTURE_ERRORS as error:
        return Invalid(
            f"invalid {event}: {_describe(error, event)}",
            event=event,
            message_id=_usable(obj.get("messageId"), MAX_ID_LENGTH),
            type=_usable(obj.get("type"), MAX_TYPE_LENGTH),
        )


def event_name(frame: Frame) -> str:
    return _EVENT_OF[type(frame)]


class EncodeError(ValueError):
    """A frame that cannot be written as JSON (e.g. an integer over 64 bits)."""


def encode(frame: Frame) -> bytes:
    body = {"event": _EVENT_OF[type(frame)], **converter.unstructure(frame)}
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as error:
        raise EncodeError(str(error)) from None


def encode_request(receiver: str, message_id: str, type: str, payload: dict[str, Any]) -> bytes:
    """
    ``encode(GatewayRequest(...))`` without building the frame (every request
    to a computer goes through here): the same checks (``ValueError`` for a
    type of the wrong length, ``EncodeError`` for a payload orjson cannot
    write) and the same bytes.
    """
    if not type or len(type) > MAX_TYPE_LENGTH:
        raise ValueError(f"type must be 1 to {MAX_TYPE_LENGTH} characters")
    body = {
        "event": "gateway_request",
        "traposReceiverId": receiver,
        "messageId": message_id,
        "type": type,
        "payload": _as_object(payload),
    }
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as error:
        raise EncodeError(str(error)) from None


def new_message_id() -> str:
    """
    A messageId for the gateway's requests: a UUID4 string (SPEC §2).  Ids
    need to be unique, not secret: a random prefix drawn when the process
    starts, then a count (2**48 ids before it repeats).
    """
    global _next_id
    _next_id += 1
    return f"{_ID_PREFIX}{_next_id & 0xFFFFFFFFFFFF:012x}"


def _id_prefix() -> str:
    # The version (4) and variant (RFC 4122) bits, as uuid.uuid4() sets them.
    bits = random.SystemRandom().getrandbits(128) & ~(0xF000 << 64) & ~(0xC000 << 48)
    h = f"{bits | (0x4000 << 64) | (0x8000 << 48):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-"


_ID_PREFIX = _id_prefix()
_next_id = random.SystemRandom().getrandbits(48)


def encode_response(
    receiver: str,
    message_id: str,
    type: str,
    payload: dict[str, Any] | None = None,
    error: Error | None = None,
    partial: bool = False,
) -> bytes:
    """
    ``encode(GatewayResponse(...))`` without building the frame: every answer
    the gateway sends goes through here, and its fields are already valid
    (they come from a decoded request).  ``partial``: an interim answer of a
    streaming request (ok, with a payload).
    """
    body: dict[str, Any] = {
        "event": "gateway_response",
        "traposReceiverId": receiver,
        "messageId": message_id,
        "type": type,
        "ok": error is None,
    }
    if error is not None:
        body["error"] = {"code": error.code, "message": error.message}
    elif payload is not None:
        body["payload"] = payload
    if partial:
        body["partial"] = True
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as failure:
        raise EncodeError(str(failure)) from None


def decode_capabilities(value: object) -> frozenset[str]:
    """
    The capabilities in a list a computer sent (``{}`` is an empty list); names
    this gateway does not know are left out.  Raises ``TypeError``.
    """
    return frozenset(string_list(value)) & _KNOWN_CAPABILITIES


_KNOWN_CAPABILITIES = frozenset(CAPABILITIES)


def stop_message(trapos_id: str, stopped: object, message: object) -> str | None:
    """
    Why the agent is stopped on ``trapos_id`` as the gateway repeats it (SPEC §16), or None
    when it is not: the computer's own words (they say how to resume), cut, or ours when it
    sent none.  Raises ``TypeError`` when ``stopped`` is not a boolean.
    """
    if type(stopped) is not bool:
        raise TypeError("stopped must be true or false")
    if not stopped:
        return None
    if type(message) is str and message.strip():
        return cut(message)
    return (
        f"the player stopped the sandbox agent on computer {cut(trapos_id)}; "
        'on it, run "sandbox resume"'
    )


def decode_hello(payload: dict[str, Any]) -> Hello:
    """Structure a hello payload; raises ``ValueError`` with a readable reason."""
    try:
        return converter.structure(payload, Hello)
    except _STRUCTURE_ERRORS as error:
        raise ValueError(_describe(error, "payload")) from None
