"""
The gateway's HTTP client for opencode's API: the part of treq's ``HTTPClient``
that ``OpencodeClient`` and ``EventStream`` use, straight on Twisted's ``Agent``.

Every ask makes several calls (a session, its prompt, a status, an instance
given back) and each of treq's went through a URL parsed and re-encoded by
hyperlink (its host through IDNA), a cookie jar, a gzip decoder and a Basic
auth wrapper built for that call, and a body producer on the cooperator: at
N = 60 computers asking (``bench.askmanaged``), a sixth of the gateway's CPU.
opencode sets no cookie, sends no gzip unless asked, and is called on URLs the
gateway builds (``OpencodeClient.target``, ASCII, already %-encoded), so none
of that is needed; what stays is treq's meaning: the method, the URL, a bytes
body, headers, Basic auth, no redirect followed, the ``IResponse``.
The health probe keeps treq (``probe``).
"""

from __future__ import annotations

from base64 import b64encode
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer
from zope.interface import implementer


@implementer(IBodyProducer)
class _Bytes:
    """A body already in memory, written at once (treq's went through the cooperator)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def basic(username: str | bytes, password: str | bytes) -> bytes:
    """The ``Authorization`` value of Basic auth, as treq makes it (UTF-8)."""
    if isinstance(username, str):
        username = username.encode("utf-8")
    if isinstance(password, str):
        password = password.encode("utf-8")
    return b"Basic " + b64encode(username + b":" + password)


class OpencodeHTTP:
    """``request``/``get`` as treq's, for the URLs ``OpencodeClient.target`` makes; no
    redirect is followed, and the response's body is the caller's to read."""

    def __init__(self, agent: IAgent) -> None:
        self._agent = agent

    def request(
        self,
        method: str,
        url: str,
        *,
        data: bytes | None = None,
        headers: dict[bytes, list[bytes]] | None = None,
        auth: tuple[str, str] | None = None,
    ) -> Deferred:
        """Fires with the ``IResponse`` (read its body with ``treq.content``)."""
        raw = Headers(headers)
        if auth is not None:
            raw.setRawHeaders(b"Authorization", [basic(*auth)])
        producer = None if data is None else _Bytes(data)
        return self._agent.request(method.encode("ascii"), url.encode("ascii"), raw, producer)

    def get(self, url: str, **kwargs: Any) -> Deferred:
        return self.request("GET", url, **kwargs)
