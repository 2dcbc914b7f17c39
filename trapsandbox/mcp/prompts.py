"""
MCP prompts (SPEC §17): a few ways for a player's agent to start well, each
a user message that names the tools to use and in which order.  A client
shows them as commands (opencode: slash commands); their ``computer``
argument is completed from the caller's own computers (``completion``).

    debug_program   {computer, program}   read it, run it, read the error, fix
    write_program   {computer, task}      write a program, run it, fix until it works
    plan_turtle     {computer, job}       look around, count fuel, plan, then move

The text is built from the arguments only (no computer is reached to get a
prompt); each argument is cut to 200 characters.
"""

from __future__ import annotations

from typing import Any

from trapsandbox.computers.wire import cut
from trapsandbox.mcp.errors import INVALID_PARAMS, Invalid

_COMPUTER = {
    "name": "computer",
    "description": "Which computer: its traposId (7:base), id or label.",
    "required": True,
}

PROMPTS: list[dict[str, Any]] = [
    {
        "name": "debug_program",
        "title": "Debug a program on a computer",
        "description": "Find out why a CraftOS program fails, and fix it.",
        "arguments": [
            _COMPUTER,
            {
                "name": "program",
                "description": "The program's path, e.g. /mine.lua.",
                "required": True,
            },
        ],
    },
    {
        "name": "write_program",
        "title": "Write and test a program",
        "description": "Write a CraftOS Lua program for a task, then run it until it works.",
        "arguments": [
            _COMPUTER,
            {"name": "task", "description": "What the program should do.", "required": True},
        ],
    },
    {
        "name": "plan_turtle",
        "title": "Plan a turtle's job",
        "description": "Plan a turtle's job (dig, build, farm) before it moves, then do it.",
        "arguments": [
            _COMPUTER,
            {"name": "job", "description": "The job, e.g. dig a 3x3 tunnel.", "required": True},
        ],
    },
]
PROMPT_NAMES = frozenset(prompt["name"] for prompt in PROMPTS)


def _texts(arguments: dict[str, str]) -> dict[str, str]:
    computer = arguments["computer"]
    return {
        "debug_program": (
            f"The program {arguments.get('program')} on the ComputerCraft computer {computer} "
            "does not work. Read it with read_file, run it with run_command (or run_lua for a "
            "piece of it) and read the error and what it printed; if it draws on the screen, "
            "read_screen shows it. Find the cause, fix the file with write_file, and run it "
            "again until it works. Tell me what was wrong."
        ),
        "write_program": (
            f"On the ComputerCraft computer {computer}, write a CraftOS Lua program that does "
            f"this: {arguments.get('task')}. Call list_computers first to see what the player "
            "allowed; look at the files already there with list_files. Write the program "
            "with write_file, run it with run_command, read what it printed, and fix it "
            "until it works. Tell me its path and how to start it."
        ),
        "plan_turtle": (
            f"Plan this job for the turtle {computer}: {arguments.get('job')}. First look: "
            'its fuel (turtle action "getFuelLevel"), its inventory ("getItemDetail" for '
            'the slots), what is around it ("inspect", "inspectUp", "inspectDown"). Then '
            "write the plan: the moves, the fuel they take, where it ends. Only then drive it "
            "with the turtle tool, one step at a time, checking each answer; stop and tell me "
            "if a move is obstructed or the fuel runs low."
        ),
    }


def get(params: dict[str, Any]) -> dict[str, Any]:
    """``prompts/get``: the prompt's message with its arguments in place."""
    name = params.get("name")
    if type(name) is not str or name not in PROMPT_NAMES:
        raise Invalid(
            INVALID_PARAMS,
            f'no prompt "{cut(str(name))}"; the prompts are ' + ", ".join(sorted(PROMPT_NAMES)),
        )
    given = params.get("arguments") or {}
    if type(given) is not dict:
        raise Invalid(INVALID_PARAMS, "arguments must be an object of strings")
    prompt = next(p for p in PROMPTS if p["name"] == name)
    arguments: dict[str, str] = {}
    for argument in prompt["arguments"]:
        value = given.get(argument["name"])
        if type(value) is not str or not value:
            raise Invalid(INVALID_PARAMS, f"{name} needs {argument['name']}, a non-empty string")
        arguments[argument["name"]] = cut(value)
    return {
        "description": prompt["description"],
        "messages": [
            {"role": "user", "content": {"type": "text", "text": _texts(arguments)[name]}}
        ],
    }
