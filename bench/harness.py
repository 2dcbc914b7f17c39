"""
A gateway in the benchmark's own process and a computer of the CraftOS harness
(real Lua 5.2 running the real ``lua/`` client) connected to it: what
``bench.sandbox``, ``bench.live`` and ``bench.snapshots --computer`` measure
against.  The harness lives in ``tests/``: this module puts the tree first on
``sys.path`` before it imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from trapsandbox import config
from trapsandbox.tap import Gateway, build

REPO = Path(__file__).resolve().parent.parent
LUA = REPO / "lua"
CLIENT = ("apis/libsandbox.lua", "servers/sandbox.lua", "programs/sandbox.lua")
CONNECTED = "traposSandboxState and traposSandboxState.connected"


def running_gateway(reactor, state_dir: str | None = None) -> Gateway:
    """A gateway on 127.0.0.1 (no opencode), started: its parts (``tap.Gateway``);
    ``service.stopService()`` stops it."""
    settings = config.Settings(
        ports=("tcp:0:interface=127.0.0.1",),
        opencode_url="",
        state_dir=state_dir or tempfile.mkdtemp(prefix="trapsandbox-bench-state-"),
    )
    gateway = build(settings, reactor)
    gateway.service.privilegedStartService()
    gateway.service.startService()
    return gateway


def start_gateway(reactor, state_dir: str | None = None, with_snapshots: bool = False):
    """A gateway on 127.0.0.1 (no opencode) and its port; ``stopService()`` stops it."""
    gateway = running_gateway(reactor, state_dir)
    if with_snapshots:  # (the snapshots service too, for bench.snapshots)
        return gateway.service, gateway.port, gateway.snapshots
    return gateway.service, gateway.port


def computer(port: int, label: str, allow: str, **options: Any):
    """
    A harness computer (id 1) with the client installed, set to reach the gateway on
    ``port`` with ``allow``, its daemon started: wait on ``connected(c)`` before using it.
    """
    sys.path.insert(0, str(REPO))
    from tests.harness.craftos import Computer

    c = Computer(tempfile.mkdtemp(prefix="trapsandbox-bench-"), id=1, label=label, **options)
    for name in CLIENT:
        c.install(LUA / name, "/" + name)
    c.set_settings({"sandbox.url": f"ws://127.0.0.1:{port}/gateway", "sandbox.allow": allow})
    return c


def spawn_twistd(state: str, *options: str) -> subprocess.Popen:
    """
    ``twistd -n trapsandbox`` on 127.0.0.1:0 with ``options``, its state (and working)
    directory ``state``, no opencode, none of this environment's settings; its output on
    a pipe (``bench.live._listening`` reads where it listens).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "OPENCODE_"))}
    env.update(OPENCODE_URL="", PYTHONPATH=str(REPO), SANDBOX_STATE_DIR=state)
    twistd = str(Path(sys.executable).parent / "twistd")
    return subprocess.Popen(
        [twistd, "-n", "--pidfile=", "trapsandbox", "--port", "tcp:0:interface=127.0.0.1"]
        + list(options),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=state,
    )


def show(outcome: dict[str, Any], output: str | None) -> None:
    """Print a benchmark's figures as indented JSON and, given ``output``, write them there too."""
    text = orjson.dumps(outcome, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if output:
        Path(output).write_text(text)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def connected(c):
    """Fires once ``c``'s daemon has started and its hello is answered."""
    c.run("/servers/sandbox.lua")
    return c.wait_for_lua(CONNECTED)
