"""
What a model reads besides a tool's own answer (SPEC §10): the server's
instructions, and the texts of the computer's refusals and failures, each
with the advice that lets the model correct itself or tell the player what
to do.
"""

from __future__ import annotations

from typing import Any

from trapsandbox import errors
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError

INSTRUCTIONS = (
    "These tools act on ComputerCraft (CraftOS) computers in a Minecraft world, connected "
    "to this gateway. Call list_computers first. Each computer's player decides what it "
    'allows ("sandbox allow exec,eval,fs.read,fs.write,screen" on it); a refused call says '
    "which capability to ask the player for."
)

ADVICE = {
    errors.NOT_CONNECTED: "Call list_computers to see which computers are connected now.",
    errors.TIMEOUT: (
        "The computer may be busy, unloaded or lagging; try again, or with a shorter task."
    ),
    errors.FS_ERROR: (
        "CraftOS refused it. Paths are absolute from /; /rom is read-only; the disk holds "
        "about 1 MB; list_files shows what is there."
    ),
    errors.PERIPHERAL_ERROR: (
        "The peripheral or turtle refused it (CraftOS's message above); list_peripherals shows "
        "each peripheral's methods."
    ),
    errors.STOPPED: (
        "The player stopped you on this computer; do not retry. Tell them what you were "
        "doing; only they can let you continue (the command is in the message)."
    ),
    errors.UNKNOWN_TYPE: (
        "The computer runs an older trapsandbox client without this; the player can reinstall "
        "it with the gateway's installer."
    ),
    errors.OVERLOADED: "The computer has too much to do; wait for its other requests and retry.",
    errors.TOO_LARGE: "Send less at once: at most 1 MiB of file content in one call.",
}


def gateway_error_text(error: GatewayError, session: Session | None) -> str:
    """A computer's (or the gateway's) refusal of a call, and what to do about it."""
    name = session.trapos_id if session is not None else "the computer"
    if error.code == errors.FORBIDDEN and "sandbox allow" in error.message:
        # The message names the capability and the command: "computer 7:base has not
        # allowed exec: on it, run "sandbox allow exec"".  (A refusal no command lifts,
        # such as the settings file's, is told as it is, below.)
        return (
            f"Refused: {error.message}. Only the player at {name} can allow it; ask them to "
            "run that command on the computer, then call this tool again."
        )
    advice = ADVICE.get(error.code, "")
    return f"{name}: {error.code}: {error.message}. {advice}".rstrip()


def output_text(answer: dict[str, Any], header: str, ran_for: float) -> str:
    """A run's answer as text: ``header``, then what it printed, and whether it was cut."""
    parts = [header]
    if answer.get("timedOut"):
        parts.append(f"It was stopped after {ran_for:g} s (timed out); the output so far:")
    for name in ("stdout", "stderr"):
        value = answer.get(name)
        if isinstance(value, str) and value:
            parts.append(f"--- {name} ---\n{value.rstrip(chr(10))}")
            if answer.get(f"{name}Truncated"):
                parts.append(f"({name} was cut short: too much output)")
    if len(parts) == 1 or (len(parts) == 2 and answer.get("timedOut")):
        parts.append("(no output)")
    return "\n".join(parts)
