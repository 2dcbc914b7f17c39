"""
Log observers for ``twistd --logger``:

    twistd --nodaemon --logger=trapsandbox.ops.logs.journald trapsandbox   # under systemd
    twistd --nodaemon --logger=trapsandbox.ops.logs.json trapsandbox       # for a log shipper

``journald`` writes one line per event, ``<N>[namespace] message``, where
``<N>`` is the syslog priority journald reads (``SyslogLevelPrefix=``, on by
default), so ``journalctl -p warning -u trapsandbox`` shows warnings and
worse.  journald makes a separate entry of every line, so a multi-line event
(a traceback) keeps its newlines escaped as ``\\n``: one event, one entry, one
priority.  No timestamp: journald stamps every entry itself.

``json`` writes one JSON object per line: time, level, namespace, message,
traceback when there is one, and the event's plain fields (``traposId``,
``peer``, ...).

twistd calls the factory with no arguments, before it redirects stdout into
the log: each factory captures the real ``sys.stdout`` then.  Events below
``SANDBOX_LOG_LEVEL`` (``debug``, ``info`` (default), ``warn``, ``error``)
are dropped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

import orjson
from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    eventAsText,
)
from zope.interface import implementer

# journald's levels (syslog priorities) for Twisted's.
PRIORITY = {
    LogLevel.debug: 7,
    LogLevel.info: 6,
    LogLevel.warn: 4,
    LogLevel.error: 3,
    LogLevel.critical: 2,
}


def _level(event: Mapping[str, Any]) -> LogLevel:
    level = event.get("log_level")
    return level if level in PRIORITY else LogLevel.info


def _namespace(event: Mapping[str, Any]) -> str:
    system = event.get("log_system")
    if isinstance(system, str) and system != "-":
        return system
    return event.get("log_namespace") or "-"


def _text(event: Mapping[str, Any]) -> str:
    return eventAsText(event, includeTraceback=True, includeTimestamp=False, includeSystem=False)


def journald_line(event: Mapping[str, Any]) -> str:
    """One event as one journald line, newline included."""
    text = _text(event).rstrip("\n").replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\n", "\\n")
    return f"<{PRIORITY[_level(event)]}>[{_namespace(event)}] {text}\n"


def _plain(value: object) -> bool:
    return value is None or type(value) in (str, int, float, bool)


def json_line(event: Mapping[str, Any]) -> str:
    """One event as one JSON object on one line, newline included."""
    text = eventAsText(event, includeTraceback=False, includeTimestamp=False, includeSystem=False)
    body: dict[str, Any] = {
        "time": datetime.fromtimestamp(event.get("log_time") or 0, UTC).isoformat(
            timespec="milliseconds"
        ),
        "level": _level(event).name,
        "priority": PRIORITY[_level(event)],
        "namespace": _namespace(event),
        "message": text,
    }
    failure = event.get("log_failure")
    if failure is not None:
        try:
            body["traceback"] = failure.getTraceback()
        except Exception:
            body["traceback"] = repr(failure)
    for key, value in event.items():
        if not key.startswith("log_") and key not in body and key.isidentifier() and _plain(value):
            body[key] = value
    return orjson.dumps(body, default=repr).decode("utf-8") + "\n"


@implementer(ILogObserver)
class LineObserver:
    """Write ``format(event)`` to ``stream`` and flush: journald should see it now."""

    def __init__(self, stream: IO[str], format: Callable[[Mapping[str, Any]], str]) -> None:
        self._stream = stream
        self._format = format

    def __call__(self, event: Mapping[str, Any]) -> None:
        try:
            line = self._format(event)
        except Exception as error:
            line = f"<3>[trapsandbox.ops.logs] cannot format a log event: {error!r}\n"
        try:
            self._stream.write(line)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # stdout is gone (e.g. journald restarting): nothing better to do


def minimum_level(environ: Mapping[str, str]) -> LogLevel:
    name = environ.get("SANDBOX_LOG_LEVEL", "").strip().lower() or "info"
    name = {"warning": "warn", "err": "error", "crit": "critical"}.get(name, name)
    try:
        return LogLevel.levelWithName(name)
    except Exception:
        return LogLevel.info


def _observer(format: Callable[[Mapping[str, Any]], str], stream: IO[str] | None):
    observer = LineObserver(sys.stdout if stream is None else stream, format)
    level = minimum_level(os.environ)
    predicate = LogLevelFilterPredicate(defaultLogLevel=level)
    # Autobahn's debug lines show whole upgrade requests, Authorization headers included.
    predicate.setLogLevelForNamespace(
        "autobahn", LogLevel.info if level == LogLevel.debug else level
    )
    return FilteringLogObserver(observer, [predicate])


def journald(stream: IO[str] | None = None) -> ILogObserver:
    """The ``--logger`` factory for journald (via the unit's stdout)."""
    return _observer(journald_line, stream)


def json(stream: IO[str] | None = None) -> ILogObserver:
    """The ``--logger`` factory for JSON lines on stdout."""
    return _observer(json_line, stream)
