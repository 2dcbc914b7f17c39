local _VERSION = '0.1.0'

--[[
libsandbox: the computer side of the trapsandbox gateway protocol (SPEC §2, §6, §9).

Loading: libsandbox is one file, /apis/libsandbox.lua, that returns its module table, so it
works with `require('libsandbox')` (when /apis is on package.path, as under trapos) and with
`dofile('/apis/libsandbox.lua')` (plain CraftOS). The sandbox program and daemon try `require`
first and fall back to the known file locations; see `locate` at the end of each of them.

Its source is the modules in lua/sandbox/, this one first. The gateway builds the one file
from them (trapsandbox.web.client.build_libsandbox), loading each module with
`load(source, '@sandbox/NAME.lua')` so that an error names the module and its line. A module
runs as chunk(M, internal): M is the table libsandbox returns, internal what the modules share
with each other and not with programs (a module takes what it needs from internal at its top
and puts there, at its end, what later modules need). The data pack carries no one file: it
carries the modules, rom/modules/main/sandbox/NAME.lua, and as rom/modules/main/libsandbox.lua
a loader (lua/datapack/libsandbox.lua) that runs them the same way, under the same names.

OS events (all prefixed `trapos_sandbox_`):
  trapos_sandbox_send(messageId, type, payload)        a program asks the daemon to send
  trapos_sandbox_reply(messageId, ok, payload, error)  the daemon hands back the answer
  trapos_sandbox_partial(messageId, payload)           an interim answer (`partial: true`) to a
                                                       program's streaming request (`ask`): the
                                                       request is still running
  trapos_sandbox_connected(traposId)                   the hello handshake succeeded
  trapos_sandbox_capabilities()                        sandbox.allow changed (`sandbox allow`):
                                                       the daemon tells the gateway
None is queued per output piece or file chunk: the queue holds 256 events.

Daemon state is published in the shared table `_G.traposSandboxState` (`state`, `connected`,
`traposId`, `url`, `lastError`, `accountId`, `version`, `capabilities`, `updated`) so
`sandbox status` can read it without a round trip. A stopped daemon leaves its last state
behind, marked `running = false`.

Gateway requests the daemon answers: each handler module registers its types, with the
capability each needs in the setting sandbox.allow, where it defines the handler
(registerRequest, in sandbox/handlers); sandbox/requests makes the request table of them. SPEC §9
has the payloads.
Anything else is `unknown_type`; a capability not allowed is `forbidden`; CraftOS refusing a
file operation is `fs_error` with its message. No frame sent is over M.MAX_SEND (128 KiB).

Event loop interface (trapos's `_G.bootEventLoop`, or `createEventLoop()` on plain CraftOS):
  register(event, handler) -> dispose()
  setTimeout(fn, seconds)  -> clear()
  registerAny(handler)     -> dispose()    optional: every event, name first (exec and eval
                                           use it; without it they listen to M.PROGRAM_EVENTS)
Handlers are called with the event's parameters; a loop that also passes the event name
first is detected and handled.

Modules, in this order, each using only those above it; each opens with a header
(`-- == Section: NAME ==`) saying what it owns, what it needs and what it exports:
  core         Constants and argument checks    M, expect and field (cc.expect), errorValue
  consent      Capabilities                     sandbox.allow: parse, change, the settings
  encoding     Encodings                        base64, payload/error coercion, JSON lists, codec
  wire         Envelopes                        the wire frames, hello, traposId, messageIds
  loop         Event loop                       createEventLoop (plain CraftOS), every event
  capture      Output capture and the terminal  what exec/eval programs print; their terminal
  screen       The screen                       the recorder of the native terminal; watches
  jobs         Jobs                             exec/eval coroutines: resume, timeout, cancel
  handlers     Request handlers                 registerRequest; what every handler shares; ping
  exec         Programs                         exec, eval, cancel
  files        Files                            list, read, write, delete, move, make_folder
  snapshot     Snapshots                        snapshot_list
  console      Screen and input                 screen, screen_watch, input
  peripherals  Peripherals and turtles          list/call_peripheral, peripheral_events, turtle
  requests     The request table                type -> handler, type -> capability, as registered
  dispatch     Dispatch                         onMessage: frames to handlers or to programs
  session      The session (the daemon)         the WebSocket, hello, reconnect; startSession
  api          Entry points for programs        request, ask, newWrapper
]]

-- == Section: Constants and argument checks ===============================================
-- Owns: the module table M with every tunable number and OS event name, the argument checks
-- (expect and field: CraftOS's own cc.expect; expectNonEmpty) and errorValue, the
-- {code, message} every failure is made of.
-- Needs: nothing. Exports: M._VERSION, M.EVENT_*, the limits (M.MAX_SEND, ...), M.errorValue.

local M, internal = ...

local CONSTANTS = {
  _VERSION = _VERSION,
  EVENT_SEND = 'trapos_sandbox_send',
  EVENT_REPLY = 'trapos_sandbox_reply',
  EVENT_PARTIAL = 'trapos_sandbox_partial',
  -- sandbox ask: silence this long (no partial) ends it; the gateway bounds an ask at 10 min.
  ASK_IDLE_TIMEOUT = 660,
  -- After Ctrl+T (cancel), how long to wait for the gateway's final answer.
  ASK_CANCEL_WAIT = 15,
  EVENT_CONNECTED = 'trapos_sandbox_connected',
  HELLO_TIMEOUT = 10,
  CONNECT_TIMEOUT = 30,
  REQUEST_TIMEOUT = 10,
  BACKOFF_MIN = 1,
  BACKOFF_MAX = 30,
  BACKOFF_JITTER = 0.2,
  -- CC:Tweaked refuses to send (or receive) a websocket message over 128 KiB by default.
  MAX_SEND = 128 * 1024,
  -- Program requests remembered so a dropped connection can answer them (not_connected).
  MAX_IN_FLIGHT = 256,
  CLOSE_REPLACED = 4000,
  CLOSE_UNAUTHORIZED = 4001,
  EVENT_CAPABILITIES = 'trapos_sandbox_capabilities',
  -- `sandbox stop` / `sandbox resume` changed sandbox.stopped (SPEC §16): the daemon looks again.
  EVENT_STOP = 'trapos_sandbox_stop',
  -- The computer as a sandbox (SPEC §9).
  MAX_CONTENT = 64 * 1024,          -- file bytes in one read_file / write_file frame (base64)
  MAX_BINARY_CONTENT = 120 * 1024,  -- ... and in one binary part (its header fits MAX_SEND)
  MAX_BATCH_FILES = 64,             -- files in one write_files
  EXEC_TIMEOUT_MS = 30000,          -- exec / eval default timeoutMs
  MAX_OUTPUT_BYTES = 64 * 1024,     -- default and largest maxOutputBytes, per stream
  PARTIAL_INTERVAL_MS = 100,        -- partials are at least this far apart ...
  PARTIAL_MIN_BYTES = 4096,         -- ... unless they carry this much
  PARTIAL_MAX_BYTES = 16 * 1024,    -- data in one partial: even escaped 6x it fits MAX_SEND
  TERMINATE_GRACE = 1,              -- seconds a terminated program may take to end
  MAX_JOBS = 16,                    -- exec / eval running at once (overloaded past that)
  FILE_OVERHEAD = 500,              -- bytes CC:Tweaked counts for any file or folder
  -- Peripherals and turtles (SPEC §16).
  PERIPHERAL_TIMEOUT_MS = 10000,    -- a call_peripheral or turtle action may take this long
  EVENTS_TIMEOUT_MS = 60000,        -- peripheral_events default timeoutMs ...
  EVENTS_MAX_TIMEOUT_MS = 600000,   -- ... and its largest
  JSON_DEPTH = 16,                  -- nesting kept when a Lua value is made JSON
  TURTLE_BUDGET = 64,               -- default sandbox.turtle_budget: moves per ask
}
for name, value in pairs(CONSTANTS) do M[name] = value end

-- cc.expect as CraftOS's own APIs take it: `require` where the program has it, else the ROM's
-- file (a library loaded with dofile sees only _G, which has no `require`).
local function loadExpect()
  if type(require) == 'function' then
    local ok, module = pcall(require, 'cc.expect')
    if ok and type(module) == 'table' then return module end
  end
  return dofile('rom/modules/main/cc/expect.lua')
end
local ccExpect = loadExpect()
local expect, field = ccExpect.expect, ccExpect.field

-- cc.expect's wording, for a string that must not be empty.
local function expectNonEmpty(n, value)
  if type(value) == 'string' and value ~= '' then return value end
  local got = value == '' and 'empty string' or type(value)
  error(('bad argument #%d (non-empty string expected, got %s)'):format(n, got), 3)
end

local function errorValue(code, message)
  return { code = code, message = message }
end
M.errorValue = errorValue

internal.expect = expect
internal.field = field
internal.expectNonEmpty = expectNonEmpty
internal.errorValue = errorValue
