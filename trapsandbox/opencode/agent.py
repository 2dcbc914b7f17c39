"""
What opencode's agent may do and is told in an ask (SPEC §11): the session's
permission rules (the computer's tools only; a change is asked for), the
system note that says which computer it works for, and what a permission
request or a question (opencode's ``question`` tool) shows the player.
"""

from __future__ import annotations

from typing import Any

import orjson

from trapsandbox import limits

# The MCP server's name in opencode: its tools are named ``trapsandbox_<tool>``.
MCP_NAME = "trapsandbox"

# The tools that change the computer: opencode asks the player before each (unless --yes).
CHANGING_TOOLS = (
    "trapsandbox_run_command",
    "trapsandbox_run_lua",
    "trapsandbox_write_file",
    "trapsandbox_delete_file",
    "trapsandbox_send_input",
    "trapsandbox_call_peripheral",
    "trapsandbox_turtle",
)
READING_TOOLS = (
    "trapsandbox_list_computers",
    "trapsandbox_list_files",
    "trapsandbox_read_file",
    "trapsandbox_read_screen",
    "trapsandbox_list_peripherals",
)


# opencode's built-in tool that asks the user a question and waits for the answer.
QUESTION_TOOL = "question"


def session_rules(yes: bool) -> list[dict[str, str]]:
    """
    An ask session's permission rules (the last match wins): nothing but the
    computer's tools (opencode's own bash, edit, … act on the host); reading
    is free; a change is asked for unless ``yes``.  (A prompt's ``tools`` map
    would not do: opencode turns its ``true`` entries into ``allow`` rules that
    override the session's ``ask``.)
    """
    change = "allow" if yes else "ask"
    return [
        {"permission": "*", "pattern": "*", "action": "deny"},
        # opencode's question tool: its questions go to the player (SPEC §17).
        {"permission": QUESTION_TOOL, "pattern": "*", "action": "allow"},
        *({"permission": name, "pattern": "*", "action": "allow"} for name in READING_TOOLS),
        *({"permission": name, "pattern": "*", "action": change} for name in CHANGING_TOOLS),
    ]


# What the player may answer a permission request.
PERMISSION_REPLIES = ("once", "always", "reject")


def system_note(trapos_id: str, capabilities: frozenset[str]) -> str:
    """The system prompt of an ask: which computer the agent works for, and what it allows."""
    allowed = ", ".join(sorted(capabilities)) or "nothing yet"
    return (
        f"You are talking to the player at the ComputerCraft computer {trapos_id} (CraftOS, "
        "Lua 5.2, in a Minecraft world); your answer is shown on its small terminal, so keep "
        f"it short and plain. The trapsandbox_* tools act on this computer (computer = "
        f'"{trapos_id}") and only on it. Its player allowed: {allowed}; a tool that needs '
        'more says so, and the player can run "sandbox allow CAP" on the computer. The '
        "player is asked before each change you make and may refuse it. When you need the "
        "player to choose, use the question tool: they answer on the computer."
    )


def detail_of(tool: str, arguments: Any) -> str:
    """What a permission prompt shows: the command line, the first lines of code, the path."""
    if type(arguments) is not dict:
        arguments = {}
    short = tool.removeprefix(MCP_NAME + "_")
    if short == "run_command":
        args = arguments.get("args")
        words = [str(arguments.get("command", "?"))]
        if isinstance(args, list):
            words += [str(a) for a in args]
        text = " ".join(words)
    elif short == "run_lua":
        text = "\n".join(str(arguments.get("code", "")).splitlines()[:3])
    elif "path" in arguments:
        text = str(arguments["path"])
        if short == "write_file" and isinstance(arguments.get("content"), str):
            text += f" ({len(arguments['content'].encode('utf-8', 'surrogatepass'))} bytes)"
    else:
        text = orjson.dumps(arguments).decode()
    limit = limits.PERMISSION_DETAIL_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"


def questions_of(asked: Any) -> list[dict[str, Any]] | None:
    """
    What a ``question.asked`` event's questions show the player: each one's
    text, its options (label, description), whether several may be picked and
    whether the player may type an answer of their own (opencode's
    ``custom``, true unless said otherwise); None if there are none to show.
    """
    if type(asked) is not list or not asked:
        return None
    shown = []
    for question in asked[: limits.MAX_ASK_QUESTIONS]:
        if type(question) is not dict or type(question.get("question")) is not str:
            return None
        options = question.get("options") if type(question.get("options")) is list else []
        shown.append(
            {
                "question": _short(question["question"]),
                "options": [
                    {
                        "label": _short(str(option.get("label", ""))),
                        "description": _short(str(option.get("description", ""))),
                    }
                    for option in options[: limits.MAX_ASK_OPTIONS]
                    if type(option) is dict
                ],
                "multiple": question.get("multiple") is True,
                "custom": question.get("custom") is not False,
            }
        )
    return shown


def _short(text: str) -> str:
    limit = limits.PERMISSION_DETAIL_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"
