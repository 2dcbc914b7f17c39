"""
The fast paths that reach into Autobahn's and Twisted's internals, each with its why.

Speed (and memory per connection) only: ``trapsandbox.fast.paths.install``
applies them in fast mode, never an import; the plain mode
(``SANDBOX_FAST_PATHS=0``) runs the libraries as they ship.  Every library
name replaced here goes through ``_replace``, so that ``undo`` puts the
library back (the test suite runs both modes in one process).  What the
gateway needs of those internals to be correct, in both modes, is
``trapsandbox.compat.fixes``.

Everything here relies on a name those libraries do not promise to keep; the
test ``tests/unit/fast/test_patches.py`` fails loudly when an upgrade moves one, so
the workaround is mended instead of silently doing nothing.
"""

from __future__ import annotations

import errno
import select
import sys
from pprint import pformat
from typing import Any

import autobahn.twisted.websocket
import autobahn.util
import autobahn.websocket.protocol
from twisted.internet import abstract, epollreactor, main, posixbase, tcp
from twisted.python import log as legacy_log

# What each replaced name held before (owner, name) -> value, for ``undo``.
_ORIGINALS: dict[tuple[Any, str], Any] = {}
_ABSENT = object()


def _replace(owner: Any, name: str, value: Any) -> None:
    """``owner.name = value``, remembering the library's own for ``undo``."""
    _ORIGINALS.setdefault((owner, name), vars(owner).get(name, _ABSENT))
    setattr(owner, name, value)


def undo() -> None:
    """Put back every library name replaced here: the libraries as they ship."""
    while _ORIGINALS:
        (owner, name), value = _ORIGINALS.popitem()
        if value is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, value)


class _LazyFormat:
    """``pformat`` deferred until a log line that uses it is written."""

    def __init__(self, value: object) -> None:
        self._value = value

    def __str__(self) -> str:
        return pformat(self._value)

    __repr__ = __str__


class _LazyCall:
    """``function(*args)`` deferred until a log line that uses it is written."""

    __slots__ = ("_args", "_function")

    def __init__(self, function: Any, *args: Any) -> None:
        self._function = function
        self._args = args

    def __str__(self) -> str:
        return str(self._function(*self._args))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    __repr__ = __str__


def _lazy(function: Any) -> Any:
    def deferred(*args: Any) -> _LazyCall:
        return _LazyCall(function, *args)

    return deferred


# Modules whose debug lines colour their arguments (``hltype``, ``hlval``)
# before the logger knows the line will not be written.
_HIGHLIGHTING = (autobahn.websocket.protocol, autobahn.twisted.websocket)


def lazy_autobahn_debug_formatting() -> None:
    """
    Autobahn pretty-prints ~40 options on every new connection for a debug
    line that is almost never written: a quarter of a connect's CPU.  Its
    other uses of ``pformat`` are debug lines too (and timing reports, which
    we leave off).  Likewise, every read and every send of a WebSocket
    colours three values (with click) for a debug line: ~4.5 us each time.
    """
    _replace(autobahn.websocket.protocol, "pformat", _LazyFormat)
    for module in _HIGHLIGHTING:
        for name in ("hltype", "hlval"):
            function = getattr(autobahn.util, name)
            _replace(module, name, _lazy(function))


# Up to this many payload bytes, Python's integers unmask faster than Autobahn's
# NVX masker, whose C object costs ~5 us to make (once per frame); past it, NVX.
SMALL_FRAME = 512


class _IntMasker:
    """Unmasks a small frame as one XOR of two integers."""

    __slots__ = ("_mask", "_ptr")

    def __init__(self, mask: bytes) -> None:
        self._mask = bytes(mask)
        self._ptr = 0

    def pointer(self) -> int:
        return self._ptr

    def reset(self) -> None:
        self._ptr = 0

    def process(self, data: bytes) -> bytes:
        shift = self._ptr & 3
        self._ptr += len(data)
        return _unmask(self._mask[shift:] + self._mask[:shift] if shift else self._mask, data)


def _unmask(mask: bytes, data: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated, as one XOR of two integers."""
    n = len(data)
    if not n:
        return b""
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


_autobahn_masker = autobahn.websocket.protocol.create_xor_masker


def _create_masker(mask: bytes, length: int | None = None) -> Any:
    if length is not None and length <= SMALL_FRAME:
        return _IntMasker(mask)
    return _autobahn_masker(mask, length)


def fast_small_frame_masks() -> None:
    """
    Every frame a computer sends is masked, and Autobahn makes a masker
    object per frame; for the small frames of requests and answers, a
    Python one is cheaper (a health round trip, or an operator request,
    unmasks one such frame).
    """
    _replace(autobahn.websocket.protocol, "create_xor_masker", _create_masker)


class _Utf8Validator:
    """
    Autobahn's incremental UTF-8 validator (``validate`` returns ``(valid,
    ends on a code point, index, total index)``) over Python's own decoder:
    no C object per connection, and no four cffi calls per message.  The
    state between fragments is the incomplete sequence at the end, if any.
    """

    __slots__ = ("_tail", "_total")

    def __init__(self) -> None:
        self._tail = b""
        self._total = 0

    def reset(self) -> None:
        self._tail = b""
        self._total = 0

    def validate(self, ba: bytes) -> tuple[bool, bool, int, int]:
        data = self._tail + ba if self._tail else ba
        try:
            str(data, "utf-8")
        except UnicodeDecodeError as error:
            if error.reason != "unexpected end of data" or error.end != len(data):
                at = self._total - len(self._tail) + error.start
                return False, False, at - self._total, at
            self._tail = data[error.start :]  # a sequence still to be finished
        else:
            self._tail = b""
        self._total += len(ba)
        return True, not self._tail, len(ba), self._total


def python_utf8_validation() -> None:
    """Autobahn validates every text message's UTF-8 with ``_Utf8Validator``."""
    _replace(autobahn.websocket.protocol, "Utf8Validator", _Utf8Validator)


_OPEN = autobahn.websocket.protocol.WebSocketProtocol.STATE_OPEN


class WholeFrames:
    """
    For a WebSocket server protocol: a message that arrives as one whole
    frame, the usual case (masked, text, final, not compressed, up to 64 KiB,
    within the size limits, valid UTF-8), is read in one step and given to
    ``onMessage``; everything else (control frames, fragments, binary, large
    or invalid frames, a frame still arriving) goes through Autobahn's own
    ``processData`` unchanged, which then fails the connection or reads the
    frame as it always does.  Autobahn's frame-by-frame callbacks and its
    per-message bookkeeping (a frame header object, a masker, six callbacks,
    a Deferred for "message" observers) were a third of a health round trip.
    The step keeps what Autobahn keeps of such a frame: its traffic counts,
    and the cancel of a pending auto-ping timeout.

    Likewise ``sendMessage`` of a text message up to 64 KiB on an open
    connection with nothing queued writes the frame directly, with
    Autobahn's traffic counts; anything else is Autobahn's.
    """

    __slots__ = ()

    def dataReceived(self, data: bytes) -> None:
        # Autobahn's own logs a debug line (evaluating its arguments) per read.
        self._dataReceived(data)

    def sendMessage(
        self,
        payload: bytes,
        isBinary: bool = False,
        fragmentSize: int | None = None,
        sync: bool = False,
        doNotCompress: bool = False,
    ) -> None:
        length = len(payload)
        if (
            not isBinary
            and fragmentSize is None
            and not sync
            and length <= 0xFFFF
            and type(payload) is bytes
            and self.state == _OPEN
            and not self.send_queue
            and self._perMessageCompress is None
            and not self.trackedTimings
            and not self.logFrames
            and not self.logOctets
            and not self.maskServerFrames
            and not 0 < self.maxMessagePayloadSize < length
            and not 0 < self.autoFragmentSize < length
        ):
            head = b"\x81%c" % length if length <= 125 else b"\x81\x7e%c%c" % divmod(length, 256)
            stats = self.trafficStats
            stats.outgoingWebSocketMessages += 1
            stats.outgoingOctetsAppLevel += length
            stats.outgoingOctetsWebSocketLevel += length
            stats.outgoingWebSocketFrames += 1
            stats.outgoingOctetsWireLevel += len(head) + length
            self.transport.write(head + payload)
            return
        super().sendMessage(payload, isBinary, fragmentSize, sync, doNotCompress)

    def processData(self) -> bool:
        data = self.data
        if (
            data[:1] == b"\x81"
            and self.current_frame is None
            and not self.inside_message
            and self.state == _OPEN
            and not self.failedByMe
            and self._listeners is None
            and self._perMessageCompress is None
            and not self.logFrames
            and not self.trackedTimings
        ):
            second = data[1] if len(data) > 1 else 0
            if 0x80 < second < 0xFE:  # masked, 1 to 125 bytes
                length = second & 0x7F
                start = 6
            elif second == 0xFE and len(data) >= 4:  # masked, a 16-bit length
                length = (data[2] << 8) | data[3]
                start = 8
            else:
                length = start = 0
            end = start + length
            if (
                length >= (126 if start == 8 else 1)  # else Autobahn's protocol violation
                and len(data) >= end
                and not 0 < self.maxFramePayloadSize < length
                and not 0 < self.maxMessagePayloadSize < length
            ):
                mask = data[start - 4 : start]
                if length <= SMALL_FRAME:  # (no masker object: the frame is whole)
                    payload = _unmask(mask, data[start:end])
                else:
                    payload = _autobahn_masker(mask, length).process(data[start:end])
                if self.utf8validateIncoming:
                    try:
                        str(payload, "utf-8")
                    except UnicodeDecodeError:
                        return super().processData()  # Autobahn's 1007
                self.data = data[end:]
                stats = self.trafficStats
                stats.incomingOctetsWebSocketLevel += length
                stats.incomingOctetsAppLevel += length
                stats.incomingWebSocketFrames += 1
                stats.incomingWebSocketMessages += 1
                if self.autoPingTimeoutCall and self.autoPingRestartOnAnyTraffic:
                    self._cancelAutoPingTimeoutCall()
                self._onMessage(payload, False)
                return len(self.data) > 0
        return super().processData()


_buffered_write = abstract.FileDescriptor.write
_SEND_LIMIT = tcp.Server.SEND_LIMIT


def _write_through(self: Any, data: bytes) -> None:
    # Nothing waits to be sent: send now; what the socket does not take, and
    # anything when something is queued, goes Twisted's way, after it.
    if (
        type(data) is bytes
        and data
        and self.connected
        and not self._aborting
        and not self.TLS
        and not self._writeDisconnected
        and not self._tempDataLen
        and self.offset == len(self.dataBuffer)
    ):
        # tcp.Connection.writeSomeData without its slice (the data is within its
        # SEND_LIMIT) and its retry on EINTR (Python's own since 3.5).
        if len(data) <= _SEND_LIMIT:
            try:
                sent = self.socket.send(data)
            except OSError:
                sent = 0  # EAGAIN, ENOBUFS, or an error the reactor's write will report
        else:
            sent = self.writeSomeData(data)
        if type(sent) is int and sent > 0:
            if sent == len(data):
                return
            data = data[sent:]
    _buffered_write(self, data)


def write_through_accepted_connections() -> None:
    """
    Twisted queues every write until the reactor's next turn finds the socket
    writable: two ``epoll_ctl`` calls and one more event per answer (a tenth
    of a health round trip).  A write to a connection with nothing queued is
    sent at once instead, as asyncio's and Node's transports do; the order
    of the bytes, backpressure (what is left is queued as before) and how
    errors are reported (by the reactor's next write) are unchanged.  Only
    connections accepted by a listening port (``tcp.Server``): the gateway's
    own clients (treq, Redis) are untouched.
    """
    _replace(tcp.Server, "write", _write_through)


class _DirectDispatch:
    """
    ``twisted.python.log`` as the epoll reactor sees it, except that
    ``callWithLogger`` calls the reader or writer without setting up the
    legacy log context (a copied dict pushed and popped per event).  Any
    exception is still caught and logged, as there.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(legacy_log, name)

    @staticmethod
    def callWithLogger(logger: Any, func: Any, *args: Any, **kw: Any) -> Any:
        try:
            return func(*args, **kw)
        except KeyboardInterrupt:
            raise
        except BaseException:
            legacy_log.err(system="reactor")


def direct_reactor_dispatch() -> None:
    """
    The epoll reactor wraps every read and every write event in
    ``log.callWithLogger``, which only names the connection in the ``system``
    of *legacy* log events (``twisted.python.log.msg``) made meanwhile: a
    few microseconds an event, twice per operator request.  The gateway and
    the Twisted parts it uses log through ``twisted.logger``, whose lines
    name their namespace instead; legacy lines made while reading now say
    ``-`` (and an exception escaping a reader or writer, ``reactor``).
    """
    _replace(epollreactor, "log", _DirectDispatch())


_EPOLLIN = select.EPOLLIN
_EINTR = errno.EINTR
_EWOULDBLOCK = tcp.EWOULDBLOCK
_CONNECTION_DONE = main.CONNECTION_DONE
_CONNECTION_LOST = main.CONNECTION_LOST
_Server = tcp.Server
_posixbase_log = posixbase.log


def _poll_reading_accepted_directly(self: Any, timeout: float | None) -> None:
    """
    ``EPollReactor.doPoll``, except that an accepted connection that is only
    readable (the event of every request and every answer) is read here:
    what ``_doReadOrWrite``, ``tcp.Connection.doRead`` and ``_dataReceived``
    do for it, in one frame.  Every other event goes Twisted's way.
    """
    if timeout is None:
        timeout = -1
    selectables = self._selectables
    try:
        events = self._poller.poll(timeout, len(selectables))
    except OSError as err:
        if err.errno == _EINTR:
            return
        raise
    for fd, event in events:
        selectable = selectables.get(fd)
        if selectable is None:
            continue
        if event != _EPOLLIN or type(selectable) is not _Server or selectable.fileno() == -1:
            # (The reactor's log: ``_DirectDispatch`` too once direct_reactor_dispatch is in.)
            epollreactor.log.callWithLogger(selectable, self._doReadOrWrite, selectable, fd, event)
            continue
        try:
            try:
                data = selectable.socket.recv(selectable.bufferSize)
            except OSError as se:
                if se.args[0] == _EWOULDBLOCK:
                    continue
                why: Any = _CONNECTION_LOST
            else:
                if data:
                    selectable.protocol.dataReceived(data)
                    continue
                why = _CONNECTION_DONE
        except BaseException:
            # As _doReadOrWrite: logged, and the connection is dropped.
            why = sys.exc_info()[1]
            _posixbase_log.err()
        epollreactor.log.callWithLogger(
            selectable, self._disconnectSelectable, selectable, why, True
        )


def read_accepted_connections_directly() -> None:
    """
    Each read event of the epoll reactor goes through four calls
    (``callWithLogger``, ``_doReadOrWrite`` with its checks for every kind
    of event, ``doRead``, ``_dataReceived``) before the protocol hears of it,
    and an operator request is two of them.  ``doPoll`` reads an accepted
    connection that is only readable itself; the errors, their logging and
    the close are Twisted's (``_disconnectSelectable`` with the same reason).
    """
    _replace(epollreactor.EPollReactor, "doPoll", _poll_reading_accepted_directly)
    _replace(epollreactor.EPollReactor, "doIteration", _poll_reading_accepted_directly)


# What Autobahn's server protocol (26.x) keeps on each connection, by name:
# its options copied from the factory, the handshake, the frame parser, the
# close handshake and auto-ping.
AUTOBAHN_SERVER_ATTRIBUTES = (
    # ObservableMixin, WebSocketAdapterProtocol
    "is_closed", "is_open", "_transport_details",
    # options (WebSocketProtocol.CONFIG_ATTRS_SERVER)
    "logOctets", "logFrames", "trackTimings", "utf8validateIncoming", "applyMask",
    "maxFramePayloadSize", "maxMessagePayloadSize", "autoFragmentSize", "failByDrop",
    "echoCloseCodeReason", "openHandshakeTimeout", "closeHandshakeTimeout", "tcpNoDelay",
    "autoPingInterval", "autoPingTimeout", "autoPingSize", "autoPingRestartOnAnyTraffic",
    "versions", "webStatus", "requireMaskedClientFrames", "maskServerFrames",
    "perMessageCompressionAccept", "serveFlashSocketPolicy", "flashSocketPolicy",
    "allowedOrigins", "allowedOriginsPatterns", "allowNullOrigin", "maxConnections",
    "trustXForwardedFor",
    # connection state
    "_perMessageCompress", "trackedTimings", "trafficStats", "state", "send_state", "data",
    "send_queue", "triggered", "utf8validator", "wasMaxFramePayloadSizeExceeded",
    "wasMaxMessagePayloadSizeExceeded", "closedByMe", "failedByMe", "droppedByMe", "wasClean",
    "wasNotCleanReason", "wasServerConnectionDropTimeout", "wasOpenHandshakeTimeout",
    "wasCloseHandshakeTimeout", "wasServingFlashSocketPolicyFile", "localCloseCode",
    "localCloseReason", "remoteCloseCode", "remoteCloseReason", "openHandshakeTimeoutCall",
    "closeHandshakeTimeoutCall",
    "autoPingTimeoutCall", "autoPingPending", "autoPingPendingCall", "autoPingPendingSeq",
    "autoPingPendingSent",
    # the opening handshake
    "http_request_data", "http_status_line", "http_headers", "http_request_uri",
    "http_request_path", "http_request_params", "http_request_host", "websocket_version",
    "websocket_protocols", "websocket_origin", "websocket_extensions", "_wskey",
    "websocket_protocol_in_use", "websocket_extensions_in_use", "http_response_data",
    # frames and messages
    "inside_message", "current_frame", "current_frame_masker", "control_frame_data",
    "_isMessageCompressed", "utf8validateIncomingCurrentMessage", "utf8validateLast",
    "message_is_binary", "message_data", "message_data_total_length", "frame_length",
    "frame_data",
)  # fmt: skip


def protocol_slots(base: type, own: tuple[str, ...] = ()) -> tuple[str, ...]:
    """
    ``__slots__`` for a subclass of Autobahn's server protocol ``base``: the
    ~100 attributes Autobahn sets on every connection, and ``own``.

    Python 3.11 shares an instance dict's keys between instances only up to
    30 names; past that each connection has its own ~3.3 kB dict.  A slot is
    8 bytes, and a slot works for an attribute set by the base class's code
    too.  Names the classes of ``base`` define (a class attribute as a
    default, e.g. Twisted's ``transport = None``) are left to the dict: a
    slot would hide the default.  A name missing here only costs its dict
    entry (``tests/unit/fast/test_patches.py`` lists what a connection still keeps
    there).
    """
    defined = {name for cls in base.__mro__ for name in vars(cls)}
    return tuple(name for name in AUTOBAHN_SERVER_ATTRIBUTES + own if name not in defined)


# What Autobahn's server keeps of the opening handshake once it is over: the
# request's bytes, status line, headers, URI parts, key and origin, and its
# own response.  It reads them only while it processes the handshake (they
# are copied into the ``ConnectionRequest`` that ``onConnect`` is given).
HANDSHAKE_LEFTOVERS = (
    "http_request_data",
    "http_status_line",
    "http_headers",
    "http_request_uri",
    "http_request_path",
    "http_request_params",
    "http_request_host",
    "websocket_origin",
    "websocket_extensions",
    "_wskey",
    "http_response_data",
)


def release_handshake(protocol: Any) -> None:
    """
    Let go of what the opening handshake left on ``protocol`` (~1 kB a
    connection); call from ``onOpen``.
    """
    for name in HANDSHAKE_LEFTOVERS:
        setattr(protocol, name, None)


# What an accepted connection's transport is given after it is made: its
# producer (the WebSocket's Outbound, registered when it opens) and the state
# of a buffered write.
_LATER_TRANSPORT_ATTRIBUTES = (
    "producer",
    "streamingProducer",
    "producerPaused",
    "dataBuffer",
    "offset",
)


def share_transport_dict_keys() -> None:
    """
    Python 3.11 keeps the attribute names of a class's instances in one
    table that their dicts share (a transport's dict is then ~0.2 kB, not
    ~0.8 kB), but each new instance makes room for fewer new names: once a
    few dozen connections exist, a name first set then (``producer``, when a
    WebSocket opens) gives every transport that sets it a dict of its own.
    Naming them on a throwaway instance at import puts them in the table
    while there is room.
    """
    seed = tcp.Server.__new__(tcp.Server)
    for name in _LATER_TRANSPORT_ATTRIBUTES:
        setattr(seed, name, getattr(tcp.Server, name))
