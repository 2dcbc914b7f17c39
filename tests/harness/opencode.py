"""The real opencode server (npm package opencode-ai) for tests."""

import json
import os

import treq
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import REPO, clean_env, spawn
from tests.harness.support import bounded, closed_port, reactor

OPENCODE = os.environ.get("OPENCODE_BIN") or os.path.join(
    REPO, ".tools", "opencode", "node_modules", ".bin", "opencode"
)


async def _answering(url: str, seconds: float = 30) -> None:
    """Wait until ``url`` answers HTTP at all: opencode accepts before it answers."""
    pool = HTTPConnectionPool(reactor(), persistent=False)
    deadline = reactor().seconds() + seconds
    while True:
        try:
            response = await bounded(treq.get(url, pool=pool), 2)
            await bounded(treq.content(response), 2)
            return
        except Exception:
            if reactor().seconds() > deadline:
                raise
            await deferLater(reactor(), 0.1, lambda: None)


async def start_opencode(
    testcase,
    password: str,
    config: dict | None = None,
    env: dict[str, str] | None = None,
    global_config: bool = False,
    port: int | None = None,
    children: list | None = None,
) -> str:
    """
    ``opencode serve`` on a loopback port with a throwaway HOME; returns its URL.
    ``config`` is written as ``opencode.json`` in its working directory, or with
    ``global_config`` as its user config (``$XDG_CONFIG_HOME/opencode``), which
    every directory's instance reads; ``env`` is added to its environment;
    ``port`` (a free one) is where it listens, when its URL must be known first;
    ``children`` gets its process (to stop it mid-test).
    """
    if not os.path.exists(OPENCODE):
        testcase.fail(f"{OPENCODE} is missing: 'make test' installs it")
    home = os.path.abspath(testcase.mktemp())
    os.makedirs(home)
    env = clean_env(
        HOME=home,
        XDG_CONFIG_HOME=os.path.join(home, ".config"),
        XDG_DATA_HOME=os.path.join(home, ".local", "share"),
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
        XDG_STATE_HOME=os.path.join(home, ".local", "state"),
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_SERVER_PASSWORD=password,
        **(env or {}),
    )
    if config is not None:
        where = os.path.join(home, ".config", "opencode") if global_config else home
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "opencode.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    port = port or closed_port()
    argv = [OPENCODE, "serve", "--port", str(port), "--hostname", "127.0.0.1"]
    child = spawn(testcase, argv, env, cwd=home)
    if children is not None:
        children.append(child)
    await child.wait_for(r"listening on", 30)
    url = f"http://127.0.0.1:{port}"
    await _answering(url + "/config")
    return url
