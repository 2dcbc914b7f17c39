"""
The tools as a client lists them (``tools/list``, SPEC §10): each one's name,
title, description and JSON Schema of its arguments.  The descriptions are
what a model learns the tools from; change them here, and the tools' bodies
(``tools``) when a tool's arguments change.
"""

from __future__ import annotations

from typing import Any

from trapsandbox import limits

_COMPUTER = {
    "type": "string",
    "description": (
        'Which computer: its traposId ("7:base"), its bare computer id ("7") or its label '
        '("base") when that is unique among the connected computers. Omit it when exactly '
        "one computer is connected. list_computers shows them."
    ),
    # 2026-07-28 clients mirror it as the Mcp-Param-Computer header: a load balancer in
    # front of a cluster can route a call by the computer it is for without reading the body.
    "x-mcp-header": "Computer",
}
_PATH_HELP = (
    "A CraftOS path, absolute from / (e.g. /startup.lua, /data/notes.txt); /rom is the "
    "read-only system folder; the computer's disk holds about 1 MB in all."
)


def _allow(capability: str) -> str:
    return (
        f'The player must have allowed it on that computer with "sandbox allow {capability}" '
        "(otherwise the call fails and says so)."
    )


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"computer": _COMPUTER, **properties},
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


_TIMEOUT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": limits.MCP_PROGRESS_MAX_RUN_SECONDS,
    "description": (
        f"Seconds before the run is stopped (default {limits.DEFAULT_RUN_TIMEOUT_MS // 1000}); "
        "you then get its output so far. Up to "
        f"{limits.MCP_PROGRESS_MAX_RUN_SECONDS:g} when the client follows the call's "
        f"progress (opencode does), otherwise at most {limits.MCP_MAX_RUN_SECONDS:g}."
    ),
}
_PATH = {"type": "string", "minLength": 1, "description": _PATH_HELP}
_ARGS = {
    "type": "array",
    "description": "Its arguments in order, as JSON values (strings, numbers, true/false, ...).",
}


# What each tool returns as ``structuredContent`` beside its text (the section 9 answer,
# SPEC §10): described for a program, never closed (a newer client may add a field).
def _output(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_TEXT = {"type": "string"}
_RUN = {
    "timedOut": {"type": "boolean", "description": "Stopped at its timeoutSeconds."},
    "stdout": {"type": "string", "description": "What it printed (so far, if it timed out)."},
    "stderr": {"type": "string"},
    "durationMs": {"type": "number"},
}
_ENTRY = {
    "type": "object",
    "properties": {
        "name": _TEXT,
        "type": {"type": "string", "enum": ["file", "dir"]},
        "size": {"type": "number"},
        "readOnly": {"type": "boolean"},
    },
}
_SCREEN = {
    "width": {"type": "integer"},
    "height": {"type": "integer"},
    "cursorX": {"type": "integer"},
    "cursorY": {"type": "integer"},
    "lines": {"type": "array", "items": _TEXT, "description": "The screen's rows, top first."},
}
OUTPUTS: dict[str, dict[str, Any]] = {
    "list_computers": _output(
        {
            "computers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "traposId": _TEXT,
                        "id": _TEXT,
                        "label": {"type": ["string", "null"]},
                        "capabilities": {"type": "array", "items": _TEXT},
                        "version": {"type": ["string", "null"]},
                        "accountId": _TEXT,
                    },
                },
            }
        },
        ("computers",),
    ),
    "run_command": _output(
        {"exitCode": {"type": ["integer", "null"], "description": "0: it succeeded."}, **_RUN}
    ),
    "run_lua": _output(
        {
            "ok": {"type": "boolean"},
            "returns": {"type": "array", "items": _TEXT, "description": "Each serialized."},
            "error": {"type": ["string", "null"]},
            **_RUN,
        }
    ),
    "list_files": _output({"path": _TEXT, "entries": {"type": "array", "items": _ENTRY}}),
    "read_file": _output(
        {
            "path": _TEXT,
            "content": _TEXT,
            "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
            "sizeBytes": {"type": "integer"},
        },
        ("content", "encoding"),
    ),
    "write_file": _output({"bytesWritten": {"type": "integer"}, "sizeBytes": {"type": "integer"}}),
    "delete_file": _output({"deleted": {"type": "boolean"}}),
    "read_screen": _output(_SCREEN),
    "send_input": _output(
        {"queued": {"type": "integer"}, "screen": {"type": "object", "properties": _SCREEN}},
        ("queued",),
    ),
    "list_peripherals": _output(
        {
            "peripherals": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": _TEXT,
                        "types": {"type": "array", "items": _TEXT},
                        "methods": {"type": "array", "items": _TEXT},
                    },
                },
            }
        }
    ),
    "call_peripheral": _output({"returns": {"type": "array"}}),
    "turtle": _output(
        {"returns": {"type": "array"}, "fuel": {}, "selected": {"type": ["integer", "null"]}}
    ),
}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_computers",
        "title": "List the connected computers",
        "description": (
            "List the ComputerCraft computers connected to this gateway: each one's traposId "
            "(id:label), id, label and the capabilities its player allowed (exec, eval, "
            "fs.read, fs.write, screen, input, peripheral, turtle). Call it first to learn "
            "what the computer argument of the other tools can be."
        ),
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "run_command",
        "title": "Run a program on a computer",
        "description": (
            "Run a CraftOS program on a computer as its shell would (e.g. command "
            '"ls" with args ["/"], or "/programs/mine.lua"), and get its output and exit '
            "code (0: it finished without error; 1: it failed or was not found). The "
            "program gets no keyboard input: one that waits for a key times out. " + _allow("exec")
        ),
        "inputSchema": _schema(
            {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The program: a name on the shell path or a CraftOS path.",
                },
                "args": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Its arguments, one string each.",
                },
                "timeoutSeconds": _TIMEOUT,
            },
            ("command",),
        ),
    },
    {
        "name": "run_lua",
        "title": "Run Lua code on a computer",
        "description": (
            'Run a chunk of Lua on a computer (e.g. "return 6*7" or statements using '
            "turtle, redstone, peripheral, fs, os) with the computer's globals, and get its "
            "return values (each rendered with textutils.serialize), what it printed, or its "
            "compile or runtime error. " + _allow("eval")
        ),
        "inputSchema": _schema(
            {
                "code": {"type": "string", "minLength": 1, "description": "The Lua chunk."},
                "timeoutSeconds": _TIMEOUT,
            },
            ("code",),
        ),
    },
    {
        "name": "list_files",
        "title": "List a folder on a computer",
        "description": (
            "List the files and folders in a folder of a computer, with their sizes and "
            "whether they are read-only. " + _PATH_HELP + " " + _allow("fs.read")
        ),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "read_file",
        "title": "Read a file on a computer",
        "description": (
            "Read a file of a computer (up to 1 MiB). The text is the file's bytes as UTF-8 "
            "when they are valid UTF-8, otherwise base64, and the result says which. "
            + _PATH_HELP
            + " "
            + _allow("fs.read")
        ),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write_file",
        "title": "Write a file on a computer",
        "description": (
            "Create or replace a file of a computer with the given text (written as UTF-8; "
            "missing folders are created; the file is replaced whole or not at all; up to "
            "1 MiB). " + _PATH_HELP + " " + _allow("fs.write")
        ),
        "inputSchema": _schema(
            {
                "path": _PATH,
                "content": {"type": "string", "description": "The file's whole new text."},
            },
            ("path", "content"),
        ),
    },
    {
        "name": "delete_file",
        "title": "Delete a file on a computer",
        "description": "Delete a file or folder of a computer. "
        + _PATH_HELP
        + " "
        + _allow("fs.write"),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "read_screen",
        "title": "Read a computer's screen",
        "description": (
            "Read the text on a computer's terminal screen, line by line, with its size and "
            "the cursor position. " + _allow("screen")
        ),
        "inputSchema": _schema({}),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "send_input",
        "title": "Type into a computer",
        "description": (
            "Type into a computer as its player would, then see its screen: the text is "
            "typed character by character (a line break presses enter), then each key is "
            "pressed, then terminate (Ctrl+T) is sent if asked. "
            f"{limits.SEND_INPUT_SETTLE:g} s later the screen is read and returned, so you "
            "see what the input did. Use it to answer "
            "a program waiting for input (read(), a menu, a game); run_command cannot. "
            "The program must already be running on the computer's screen. "
            + _allow("input")
            + ' The screen is shown only if "screen" is allowed too.'
        ),
        "inputSchema": _schema(
            {
                "text": {
                    "type": "string",
                    "description": 'Text to type, e.g. "hello" or "yes\\n" (\\n presses enter).',
                },
                "keys": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": (
                        "Keys to press after the text, by CraftOS key name (keys.* in "
                        'CraftOS): "enter", "backspace", "tab", "up", "down", "left", '
                        '"right", "home", "end", "delete", "leftCtrl", "f1", "a", "one", ...'
                    ),
                },
                "terminate": {
                    "type": "boolean",
                    "description": "Send terminate last (as holding Ctrl+T): stops most programs.",
                },
            }
        ),
    },
    {
        "name": "list_peripherals",
        "title": "List a computer's peripherals",
        "description": (
            "List the peripherals attached to a computer (monitors, printers, speakers, disk "
            'drives, modems, chests, ...): each one\'s name (a side such as "top", or a '
            'network name such as "monitor_0"), its types and its methods. Call it before '
            "call_peripheral. " + _allow("peripheral")
        ),
        "inputSchema": _schema({}),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "call_peripheral",
        "title": "Call a peripheral's method",
        "description": (
            "Call one method of a peripheral attached to a computer, as peripheral.call(name, "
            'method, ...) in CraftOS (e.g. name "top", method "write", args ["hello"] on a '
            "monitor), and get its return values as JSON (tables as lists or objects, "
            "functions by their type name). A failing call returns CraftOS's error message. "
            + _allow("peripheral")
        ),
        "inputSchema": _schema(
            {
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The peripheral's name, as list_peripherals shows it.",
                },
                "method": {"type": "string", "minLength": 1, "description": "The method."},
                "args": _ARGS,
            },
            ("name", "method"),
        ),
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "turtle",
        "title": "Drive a turtle",
        "description": (
            "Do one action with a turtle (a ComputerCraft robot) as its turtle API would: "
            "forward, back, up, down, turnLeft, turnRight (a move uses 1 fuel), dig, digUp, "
            "digDown, place, placeUp, placeDown, detect*, inspect*, compare*, attack*, "
            "drop*, suck*, select, getItemCount, getItemDetail, transferTo, getFuelLevel, "
            "refuel, equipLeft, equipRight, craft. You get its return values (true, or "
            'false and a reason such as "Movement obstructed"), the fuel left and the '
            "selected slot (1-16). An ask may move the turtle a limited number of times "
            "(the player's sandbox.turtle_budget, 64 by default). " + _allow("turtle")
        ),
        "inputSchema": _schema(
            {
                "action": {
                    "type": "string",
                    "minLength": 1,
                    "description": 'The turtle API function, e.g. "forward" or "dig".',
                },
                "args": _ARGS,
            },
            ("action",),
        ),
        "annotations": {"destructiveHint": True},
    },
]
for _tool in TOOLS:
    _tool["outputSchema"] = OUTPUTS[_tool["name"]]
TOOL_NAMES = frozenset(tool["name"] for tool in TOOLS)
