"""Every event on Twisted's global log publisher while a test runs, at every level."""

from __future__ import annotations

from twisted.logger import LogLevel, formatEvent, globalLogPublisher


def event_text(event) -> str:
    """An event as a person or a log shipper would see it: message, fields, traceback."""
    parts = [formatEvent(event)]
    failure = event.get("log_failure")
    if failure is not None:
        try:
            parts.append(failure.getTraceback())
        except Exception:
            parts.append(repr(failure))
    parts.append(repr({key: value for key, value in event.items() if key != "log_failure"}))
    return "\n".join(parts)


class LogCapture:
    """Keeps every event from now until the test's cleanup."""

    def __init__(self, testcase) -> None:
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self)
        testcase.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event) -> None:
        self.events.append(event)

    def texts(self) -> list[str]:
        return [event_text(event) for event in self.events]

    def errors(self) -> list[str]:
        """Events logged with a failure, or at error level or above."""
        return [
            event_text(event)
            for event in self.events
            if event.get("log_failure") is not None
            or event.get("log_level") in (LogLevel.error, LogLevel.critical)
        ]
