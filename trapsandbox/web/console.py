"""
The web console's files (SPEC §14), ``GET /`` and ``/console/<name>``.

Plain HTML, CSS and JavaScript (native ES modules, ``console.js`` the page's)
shipped in the package (``console/``; nothing fetched from elsewhere at run
time), read at each request as ``client`` reads the Lua files.  One file is
built: ``editor.js``, the files panel's code editor (CodeMirror 6), bundled
from npm packages by esbuild when the package is built (``setup.py``,
``make``); without it the files panel opens files read-only in a plain text
area and says why.  Every answer carries a strict ``Content-Security-Policy``:
the page runs only its own script and style and connects only to its own
origin (``/operator``), so nothing injected into a computer's screen or label
can run.  The token never travels in a URL: the page sends it as the first
``/operator`` message (``web.opsocket``).
"""

from __future__ import annotations

from pathlib import Path

FILES = {
    "index.html": b"text/html; charset=utf-8",
    "console.css": b"text/css; charset=utf-8",
    "console.js": b"text/javascript; charset=utf-8",
    "operator.js": b"text/javascript; charset=utf-8",
    "files.js": b"text/javascript; charset=utf-8",
    "transfer.js": b"text/javascript; charset=utf-8",
    "agent.js": b"text/javascript; charset=utf-8",
    "editor.js": b"text/javascript; charset=utf-8",
}
INDEX = "index.html"

# 'self' for ws:/wss: to the same host is not understood by every browser: say both.
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; "
    b"frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


def read(name: str) -> tuple[bytes, bytes] | None:
    """``(content type, body)`` of one of ``FILES``; None for any other name, or one not built."""
    kind = FILES.get(name)
    if kind is None:
        return None
    try:
        return kind, (Path(__file__).with_name("console") / name).read_bytes()
    except FileNotFoundError:
        return None
