"""
MCP logging (SPEC §17): the ``notifications/message`` lines a tool run sends
its client, so the model reads what happened beside the result: a refusal
with its hint, a run's stderr.  Never a secret: no argument a caller sent
(a file's content, a command line) is logged, only what the computer or the
gateway said.

Who hears them, and from which level (RFC 5424's, ``LEVELS``):

    legacy   the level ``logging/setLevel`` set for the client's connection
             (its credential and ``Mcp-Session-Id``; ``Levels``); none
             before it, so a client that never asks (opencode) hears none
    modern   the request's own ``_meta`` ``io.modelcontextprotocol/logLevel``;
             none without it (2026-07-28: MUST NOT)

and only on the answer's own event stream, when the client takes one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {level: n for n, level in enumerate(LEVELS)}

# Connections whose level is remembered (legacy): the least recently set is forgotten.
MAX_CONNECTIONS = 4096


def at_least(level: str, threshold: str) -> bool:
    """Whether a line at ``level`` passes a client's ``threshold``."""
    return _RANK[level] >= _RANK[threshold]


class Levels:
    """The level each legacy client connection set with ``logging/setLevel``."""

    def __init__(self, most: int = MAX_CONNECTIONS) -> None:
        self._levels: OrderedDict[Hashable, str] = OrderedDict()
        self._most = most

    def set(self, connection: Hashable, level: str) -> None:
        self._levels[connection] = level
        self._levels.move_to_end(connection)
        while len(self._levels) > self._most:
            self._levels.popitem(last=False)

    def get(self, connection: Hashable) -> str | None:
        return self._levels.get(connection)
