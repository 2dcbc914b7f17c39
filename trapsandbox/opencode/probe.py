"""
The opencode probe: is the opencode server at ``OPENCODE_URL`` answering?

``GET {url}/config`` with HTTP Basic auth; healthy means a 2xx answer with a
JSON content type (opencode answers unknown paths with its HTML web UI and a
200, so a bare status check is fooled by a wrong URL).  The whole exchange,
headers and body, is bounded.  Callers that ask while a probe is in flight
share it: a burst of health requests makes one HTTP request.  A success is
reused for ``PROBE_FRESH_FOR`` seconds, so a steady stream of health requests
makes about one HTTP request a second, and most are answered without waiting.
A failure is never reused: a player who has just started opencode must not
be told it is down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import treq
from hyperlink import DecodedURL
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectError, ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed

from trapsandbox import limits
from trapsandbox.ops.metrics import Metrics

log = Logger()


@attrs.frozen
class ProbeResult:
    ok: bool
    detail: str | None = None
    # Why, as a metrics label (trapsandbox.ops.metrics.PROBE_OUTCOMES).
    outcome: str = attrs.field(default="", eq=False, repr=False)

    # Several opencode servers (``servers.ServerProbes``): each one's {url, ok, detail?}.
    servers: tuple[dict[str, Any], ...] = attrs.field(default=(), eq=False, repr=False)

    # The answer to probe_gateway, built once and shared: never modify it.
    payload: dict[str, Any] = attrs.field(init=False, eq=False, repr=False)

    @payload.default
    def _payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"sandboxOk": True, "opencodeOk": self.ok}
        if self.detail is not None and (not self.ok or self.servers):
            payload["opencodeDetail"] = self.detail  # with several servers: those down
        if self.servers:
            payload["opencodeServers"] = [dict(server) for server in self.servers]
        return payload

    def to_payload(self) -> dict[str, Any]:
        """A copy of ``payload`` to add to."""
        return dict(self.payload)


_NOT_SET = ProbeResult(False, "OPENCODE_URL not set", outcome="not_set")


def redact(url: str) -> str:
    """The URL without any user:password part."""
    try:
        parsed = DecodedURL.from_text(url)
    except (ValueError, TypeError):
        return "<unparseable URL>"
    return parsed.replace(userinfo="").to_text() if parsed.userinfo else url


class OpencodeProbe:
    """
    Probe opencode with ``http`` (a treq ``HTTPClient`` or ``StubTreq``).

    ``check()`` returns a Deferred that always fires with a ``ProbeResult``.
    """

    def __init__(
        self,
        http: Any,
        clock: IReactorTime,
        url: str,
        username: str = limits.DEFAULT_OPENCODE_USERNAME,
        password: str | None = None,
        timeout: float = limits.PROBE_TIMEOUT,
        metrics: Metrics | None = None,
        fresh_for: float = limits.PROBE_FRESH_FOR,
        unready: Callable[[], str | None] | None = None,
    ) -> None:
        self._http = http
        # An opencode the gateway runs (``managed``): why it cannot answer now, if so.
        self._unready = unready
        self._clock = clock
        self._timeout = timeout
        self._auth = (username, password) if password else None
        self._waiters: list[Deferred] | None = None
        self._fresh_for = fresh_for
        self._latest: ProbeResult | None = None
        self._latest_at = 0.0
        self._metrics = Metrics() if metrics is None else metrics
        self.url = url
        self.requests_made = 0
        if url:
            base = url.rstrip("/")
            self._where = f"{redact(base)}/config"
            # Parsed once: treq would otherwise parse (and IDNA-encode) it per call.
            self._target = DecodedURL.from_text(base + "/config")

    def fresh(self) -> ProbeResult | None:
        """The latest success if it is recent enough to reuse, else None."""
        if not self.url:
            return _NOT_SET
        why = None if self._unready is None else self._unready()
        if why is not None:
            return ProbeResult(False, why, "unreachable")
        latest = self._latest
        if latest is not None and self._clock.seconds() - self._latest_at < self._fresh_for:
            return latest
        return None

    def check(self) -> Deferred:
        """Fires with a ``ProbeResult``: a fresh one, or the next one."""
        result = self.fresh()
        if result is not None:
            return succeed(result)
        d = Deferred()
        if self._waiters is not None:
            self._waiters.append(d)
            return d
        self._waiters = [d]
        self.requests_made += 1
        exchange = self._exchange()
        # The timeout first: what its cancellation raises is not an error to explain.
        exchange.addTimeout(self._timeout, self._clock, onTimeoutCancel=self._timed_out)
        exchange.addErrback(self._explain)
        exchange.addCallback(self._deliver, self._clock.seconds())
        return d

    def _exchange(self) -> Deferred:
        d = self._http.get(
            self._target,
            auth=self._auth,
            headers={b"Accept": [b"application/json"]},
            allow_redirects=False,
        )
        d.addCallback(self._read)
        return d

    def _read(self, response) -> Deferred:
        # Read (and drop) the body so the connection can be reused; the
        # timeout covers this part too.
        body = treq.content(response)
        body.addCallback(lambda _: self._judge(response))
        return body

    def _judge(self, response) -> ProbeResult:
        code = response.code
        content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        media = content_type.split(b";")[0].strip().lower()
        if 200 <= code < 300 and (media == b"application/json" or media.endswith(b"+json")):
            return ProbeResult(True, outcome="ok")
        if code == 401:
            return ProbeResult(
                False,
                f"{self._where} answered 401 Unauthorized: check OPENCODE_SERVER_PASSWORD "
                "and OPENCODE_SERVER_USERNAME",
                outcome="unauthorized",
            )
        if 200 <= code < 300:
            shown = media.decode("latin-1") or "no content type"
            return ProbeResult(
                False,
                f"{self._where} answered {code} with {shown}, not JSON: "
                "is OPENCODE_URL an opencode server?",
                outcome="not_json",
            )
        return ProbeResult(False, f"{self._where} answered HTTP {code}", outcome="http_error")

    def _timed_out(self, result: object, timeout: float) -> ProbeResult:
        return ProbeResult(False, f"{self._where}: no answer within {timeout:g} s", "timeout")

    def _explain(self, failure: Failure) -> ProbeResult:
        outcome = "unreachable"
        if failure.check(ConnectionRefusedError):
            reason = "connection refused: is opencode running?"
        elif failure.check(DNSLookupError):
            reason = "host name not found"
        elif failure.check(ConnectError):
            reason = f"cannot connect: {failure.getErrorMessage()}"
        elif failure.check(ResponseFailed):
            reason = "the connection closed before a complete answer"
            outcome = "error"
        else:
            log.failure("opencode probe failed unexpectedly", failure)
            reason = f"probe failed: {failure.getErrorMessage() or failure.type.__name__}"
            outcome = "error"
        return ProbeResult(False, f"{self._where}: {reason}", outcome)

    def _deliver(self, result: ProbeResult, started: float) -> None:
        self._metrics.probe(result.outcome or "error", self._clock.seconds() - started)
        self._latest = result if result.ok else None
        self._latest_at = self._clock.seconds()
        waiters, self._waiters = self._waiters or [], None
        for d in waiters:
            d.callback(result)
