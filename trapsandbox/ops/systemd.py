"""
sd_notify(3) in a few lines: readiness, stopping and watchdog pings to the
service manager over the AF_UNIX datagram socket named by ``NOTIFY_SOCKET``.

Without ``NOTIFY_SOCKET`` (not started by systemd with ``Type=notify``)
every call is a no-op, so the daemon runs the same anywhere.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

log = Logger()


def _address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        # An abstract socket: a leading NUL byte instead of the "@".
        return b"\0" + value[1:].encode("utf-8")
    if value.startswith("/"):
        return value
    return None  # e.g. vsock:..., which this daemon never runs under


def watchdog_interval(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, or None when no watchdog is asked for us."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    return usec / 2 / 1_000_000 if usec > 0 else None


class Notifier:
    """Send ``KEY=value`` lines to systemd, and keep its watchdog fed."""

    def __init__(
        self,
        clock: IReactorTime,
        notify_socket: str | None = None,
        watchdog: float | None = None,
    ) -> None:
        self._clock = clock
        self._address = _address(notify_socket) if notify_socket else None
        self._socket: socket.socket | None = None
        self._watchdog_interval = watchdog
        self._watchdog: LoopingCall | None = None
        self._warned = False

    @classmethod
    def from_environ(cls, clock: IReactorTime, environ: Mapping[str, str]) -> Notifier:
        return cls(clock, environ.get("NOTIFY_SOCKET") or None, watchdog_interval(environ))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> None:
        if self._address is None:
            return
        try:
            if self._socket is None:
                kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                self._socket = socket.socket(socket.AF_UNIX, kind)
                # A stuck service manager must never block the reactor.
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(lines).encode("utf-8"), self._address)
        except OSError as error:
            if not self._warned:
                self._warned = True
                log.warn("cannot notify systemd: {error}", error=error)

    def ready(self, status: str = "") -> None:
        """The ports are bound: ``READY=1``, and start the watchdog pings."""
        self.notify("READY=1", *([f"STATUS={status}"] if status else []))
        if self._address is not None and self._watchdog_interval and self._watchdog is None:
            self._watchdog = LoopingCall(self.notify, "WATCHDOG=1")
            self._watchdog.clock = self._clock
            self._watchdog.start(self._watchdog_interval, now=True)

    def stopping(self) -> None:
        self._stop_watchdog()
        self.notify("STOPPING=1", "STATUS=shutting down")

    def close(self) -> None:
        self._stop_watchdog()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            if self._watchdog.running:
                self._watchdog.stop()
            self._watchdog = None
