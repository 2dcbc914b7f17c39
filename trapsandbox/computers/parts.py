"""
File parts as binary WebSocket messages, for a client that announced ``binary_parts`` in
hello (docs/protocol.md, "Binary file parts").

A part crosses as one binary message: the frame as JSON, without its ``content``, its
payload's ``encoding`` "binary"; one newline; the raw bytes.  No JSON writer puts a raw
newline in its output, so the first newline ends the header.

    gateway -> computer   gateway_request write_file {path, encoding: "binary", part} \\n bytes
    gateway -> computer   gateway_request write_files {encoding: "binary", writeId,
                                                       files: [{path, size}]} \\n bytes
    computer -> gateway   computer_response read_file {encoding: "binary", sizeBytes, ...} \\n bytes

``write_files`` (several whole files, their bytes one after another) goes only to a client
that announced it too; the last answers a ``read_file`` that asked for ``encoding: "binary"``.
Inside the gateway a part's ``content`` is then ``bytes``; to any other client it is base64
text in a text frame, as before, and only ``Sandbox`` asks for binary parts, only of a client
that announced them.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import attrs

from trapsandbox.computers import wire

BINARY = "binary"


class BinaryFrame(bytes):
    """A message to send as a binary WebSocket frame (``Sending._write``)."""

    __slots__ = ()


def encode_request(
    receiver: str, message_id: str, type: str, payload: dict[str, Any], features: frozenset[str]
) -> bytes:
    """
    ``wire.encode_request``, a ``write_file``'s content as a binary part to a client that
    takes them (its hello's ``features``), as base64 text to one that does not; a
    ``read_file`` asking for a binary answer of a client that cannot give one asks for
    base64.  Raises what ``wire.encode_request`` raises, and ``ValueError`` for content
    that is not base64 or a ``write_files`` to a client that did not announce it.
    """
    binary = wire.BINARY_PARTS in features
    if type == "write_files" and not wire.WRITES_IN_BATCHES <= features:
        raise ValueError("this computer's client does not take write_files")
    if type in ("write_file", "write_files"):
        content = payload.get("content")
        if binary and isinstance(content, bytes | str):
            raw = content if isinstance(content, bytes) else _base64(content)
            header = {key: value for key, value in payload.items() if key != "content"}
            header["encoding"] = BINARY
            return BinaryFrame(
                wire.encode_request(receiver, message_id, type, header) + b"\n" + raw
            )
        if isinstance(content, bytes):
            payload = {**payload, "content": base64.b64encode(content).decode("ascii")}
            payload["encoding"] = "base64"
    elif type == "read_file" and not binary and payload.get("encoding") == BINARY:
        payload = {**payload, "encoding": "base64"}
    return wire.encode_request(receiver, message_id, type, payload)


def answered_in_binary(type: str, payload: dict[str, Any], features: frozenset[str]) -> bool:
    """Whether the answer to this request comes as a binary message: a ``read_file`` asking
    for it of a client that announced binary parts.  No other answer may."""
    return (
        type == "read_file" and payload.get("encoding") == BINARY and wire.BINARY_PARTS in features
    )


def _base64(content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except binascii.Error as error:
        raise ValueError(f"content is not base64: {error}") from None


def decode_response(message: bytes) -> wire.ComputerResponse | wire.Invalid:
    """A binary message from a computer: a response with its payload's ``content`` the raw
    bytes, or why it is not one (never raises)."""
    header, newline, raw = message.partition(b"\n")
    if not newline:
        return wire.Invalid("a binary frame with no header")
    frame = wire.decode(header)
    if type(frame) is wire.Invalid:
        return frame
    if type(frame) is not wire.ComputerResponse:
        return wire.Invalid("a binary frame that is not a response")
    if not frame.ok or frame.partial:
        return wire.Invalid(
            "a binary frame that is not a file part's answer",
            event="computer_response",
            message_id=frame.message_id,
            type=frame.type,
        )
    # (A payload that is not an object is read as {}, as everywhere: SPEC section 2.)
    payload = frame.payload if type(frame.payload) is dict else {}
    return attrs.evolve(frame, payload={**payload, "content": raw})
