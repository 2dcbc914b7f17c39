local _VERSION = '0.1.0'

--[[
libsandbox, built from its modules in lua/sandbox/ by trapsandbox.web.client.build_libsandbox:
change those, not this file. Each module is loaded under its own name, so an error or a
traceback names sandbox/NAME.lua and the line in it. sandbox/core.lua says what libsandbox is.
]]

local M, internal = {}, {}
local function loadModule(name, source)
  local chunk, err = load(source, '@sandbox/' .. name .. '.lua', 't', _ENV)
  if not chunk then error(err, 0) end
  chunk(M, internal)
end

loadModule('core', [=[
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
]=])

loadModule('consent', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/consent: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Capabilities (consent) ======================================================
-- Owns: what the owner may allow (setting sandbox.allow): the list, its parsing and changing,
-- the settings' definitions and the whole-computer warning.
-- Needs: constants. Exports: M.CAPABILITIES, M.parseCapabilities, M.changeCapabilities,
-- M.WHOLE_COMPUTER, M.grantsWholeComputer, M.defineSettings.

local M, internal = ...
local expect = internal.expect

-- What the owner may allow (setting sandbox.allow), in the order they are listed.
M.CAPABILITIES = { 'exec', 'eval', 'fs.read', 'fs.write', 'screen', 'input', 'peripheral', 'turtle' }

-- Allowed only by name: `all` (and the installer's "y") leaves them out, since a turtle is a
-- moving machine that digs and places blocks in the world; `deny all` still takes them back.
M.NAMED_ONLY = { turtle = true }

-- Said wherever turtle is allowed (the installer's separate question, `sandbox allow`).
M.MOVING_MACHINE = 'turtle lets the agent drive this turtle, a moving machine: it moves, digs, places '
  .. 'and drops blocks in the world'

local KNOWN_CAPABILITY = {}
for _, name in ipairs(M.CAPABILITIES) do KNOWN_CAPABILITY[name] = true end

local function orderedCapabilities(set)
  local list = {}
  for _, name in ipairs(M.CAPABILITIES) do
    if set[name] then list[#list + 1] = name end
  end
  return list
end

-- The allowed list from a sandbox.allow value ("exec, fs.read"), in canonical order. Unknown
-- names are dropped: a hand-edited setting can only ever allow less.
function M.parseCapabilities(value)
  local set = {}
  if type(value) == 'string' then
    for name in value:gmatch('[^,%s]+') do
      if KNOWN_CAPABILITY[name] then set[name] = true end
    end
  end
  return orderedCapabilities(set)
end

--[[ changeCapabilities(value, allow, names) -> newValue, list | nil, message
`sandbox allow` (allow = true) or `sandbox deny` (false) applied to a sandbox.allow value;
`all` stands for every capability. A name that is not a capability changes nothing. ]]
function M.changeCapabilities(value, allow, names)
  expect(2, allow, 'boolean')
  expect(3, names, 'table')
  local known = table.concat(M.CAPABILITIES, ', ') .. ' or all (all but turtle)'
  if #names == 0 then return nil, 'name at least one capability: ' .. known end
  local set = {}
  for _, name in ipairs(M.parseCapabilities(value)) do set[name] = true end
  for _, name in ipairs(names) do
    if name == 'all' then
      for _, each in ipairs(M.CAPABILITIES) do
        if not (allow and M.NAMED_ONLY[each]) then set[each] = allow or nil end
      end
    elseif KNOWN_CAPABILITY[name] then
      set[name] = allow or nil
    else
      return nil, ('unknown capability %s (known: %s)'):format(tostring(name), known)
    end
  end
  local list = orderedCapabilities(set)
  return table.concat(list, ','), list
end

-- Said in plain words wherever exec, eval or input is allowed (the installer's question,
-- `sandbox allow`): file requests keep away from /.settings, but a program or Lua chunk can read
-- it, and typing into the shell can run either.
M.WHOLE_COMPUTER = 'exec, eval and input (running programs and Lua, typing on the computer) give the agent the whole computer, '
  .. 'including its sandbox password'

-- Whether a list in `allowed` (names as given to `sandbox allow`, or a new allowed list) has exec, eval, input
-- or all.
function M.grantsWholeComputer(allowed)
  for _, name in ipairs(allowed) do
    if name == 'exec' or name == 'eval' or name == 'input' or name == 'all' then return true end
  end
  return false
end

-- Whether a list of names given to `sandbox allow` has turtle (never part of all).
function M.grantsTurtle(allowed)
  for _, name in ipairs(allowed) do
    if name == 'turtle' then return true end
  end
  return false
end

-- The consent the installer and `sandbox setup` ask for, in the same words.
--[[ consentFromArgument(text) -> value, notes | nil, message
--allow=CAPS of the installer and of `sandbox setup`: all, none or names (exec,fs.read); the
sandbox.allow value and the notes to print (whole computer, moving machine). ]]
function M.consentFromArgument(text)
  expect(1, text, 'string')
  local names = {}
  if text ~= 'none' then
    for name in text:gmatch('[^,%s]+') do names[#names + 1] = name end
  end
  if #names == 0 then return '', {} end
  local value, err = M.changeCapabilities('', true, names)
  if not value then return nil, err end
  local notes = {}
  if M.grantsWholeComputer(names) then notes[#notes + 1] = M.WHOLE_COMPUTER end
  if M.grantsTurtle(names) then notes[#notes + 1] = M.MOVING_MACHINE end
  return value, notes
end

--[[ askConsent(write, read, isTurtle) -> value
Asks once, in plain words, whether the agent may act here (y: all; anything else: nothing),
and on a turtle separately whether it may drive it. Returns the sandbox.allow value. ]]
function M.askConsent(write, read, isTurtle)
  expect(1, write, 'function')
  expect(2, read, 'function')
  write('Let the sandbox agent run programs and Lua, read and change files, see the screen, type on '
    .. 'this computer and use its peripherals? Note: ' .. M.WHOLE_COMPUTER .. '. [y/N] ')
  local answer = read()
  local value = ''
  if type(answer) == 'string' and answer:lower():match('^%s*y') then
    value = M.changeCapabilities('', true, { 'all' })
  end
  -- A turtle is asked separately: "all" never includes it (SPEC §16).
  if isTurtle then
    write('This is a turtle. Let the sandbox agent drive it too? Note: ' .. M.MOVING_MACHINE .. '. [y/N] ')
    local drive = read()
    if type(drive) == 'string' and drive:lower():match('^%s*y') then
      value = M.changeCapabilities(value, true, { 'turtle' })
    end
  end
  return value
end

--[[ gatewayUrl(text) -> url | nil, message
The gateway's WebSocket URL from what a player or admin types: its base URL
(http://host:4444, https://...) or the WebSocket URL itself (ws://host:4444/gateway). ]]
function M.gatewayUrl(text)
  expect(1, text, 'string')
  local url = text:gsub('^%s+', ''):gsub('%s+$', '')
  local scheme, rest = url:match('^(%a+)://([^%s]+)$')
  scheme = scheme and scheme:lower()
  if not rest or rest:sub(1, 1) == '/' then
    return nil, 'not a URL: ' .. text .. ' (give the gateway as http://HOST:4444)'
  end
  if scheme == 'ws' or scheme == 'wss' then return scheme .. '://' .. rest end
  if scheme ~= 'http' and scheme ~= 'https' then
    return nil, 'the gateway URL must start with http://, https://, ws:// or wss://: ' .. text
  end
  rest = rest:gsub('/+$', '')
  return (scheme == 'https' and 'wss://' or 'ws://') .. rest .. '/gateway'
end

-- Whether the player has set this computer up (the installer or `sandbox setup` saved
-- sandbox.url): until then nothing connects.
function M.isSetUp()
  local url = settings and settings.get('sandbox.url')
  return type(url) == 'string' and url ~= ''
end

-- The `sandbox` command's subcommands, in its usage order (completion, help).
M.SUBCOMMANDS = { 'setup', 'health', 'status', 'allow', 'deny', 'stop', 'resume', 'ask', 'snapshots',
  'changes', 'undo' }
M.ASK_FLAGS = { '--new', '--yes' }

-- Those of `choices` that start with `text`, as what is left to type (shell completion).
local function completeFrom(text, choices, addSpace)
  local found = {}
  for _, choice in ipairs(choices) do
    if #choice > #text and choice:sub(1, #text) == text then
      found[#found + 1] = choice:sub(#text + 1) .. (addSpace and ' ' or '')
    end
  end
  return found
end

--[[ complete(shell, index, text, previous) -> suffixes
The `sandbox` command's completion (shell.setCompletionFunction): subcommands, capabilities
after allow and deny (each once), ask's flags before its prompt. ]]
function M.complete(_, index, text, previous)
  if index == 1 then return completeFrom(text, M.SUBCOMMANDS, true) end
  local command = previous[2]
  if command == 'allow' or command == 'deny' then
    local given, choices = {}, {}
    for i = 3, #previous do given[previous[i]] = true end
    for _, name in ipairs(M.CAPABILITIES) do
      if not given[name] then choices[#choices + 1] = name end
    end
    if not given.all then choices[#choices + 1] = 'all' end
    return completeFrom(text, choices, true)
  end
  if command == 'ask' then
    for i = 3, #previous do
      if previous[i]:sub(1, 2) ~= '--' then return {} end
    end
    return completeFrom(text, M.ASK_FLAGS, true)
  end
  return {}
end

-- The settings the daemon and the `sandbox` command read, with descriptions for `set`.
function M.defineSettings()
  if not (settings and settings.define) then return end
  settings.define('sandbox.url', {
    description = 'WebSocket URL of the trapsandbox gateway, e.g. ws://host:4444/gateway; set by the installer '
      .. 'or "sandbox setup" (until then nothing connects)',
    type = 'string',
  })
  settings.define('sandbox.password', {
    description = 'Shared secret the sandbox daemon presents to the gateway (the account\'s secret, or '
      .. 'SANDBOX_PASSWORD); asked for by the installer and "sandbox setup"',
    type = 'string',
  })
  settings.define('sandbox.allow', {
    description = 'What the sandbox agent may do here, comma-separated: exec (run programs), eval (run Lua), '
      .. 'fs.read (list and read files), fs.write (write and delete files), screen (read the terminal), '
      .. 'input (type keys and click on it), peripheral (list, call and watch attached peripherals), '
      .. 'turtle (move, dig and place with this turtle; not included in all). '
      .. 'Change it with "sandbox allow CAP..." / "sandbox deny CAP..."',
    type = 'string',
    default = '',
  })
  settings.define('sandbox.stopped', {
    description = 'Set by "sandbox stop": every request of the agent is refused until "sandbox resume"',
    type = 'boolean',
    default = false,
  })
  settings.define('sandbox.stop_side', {
    description = 'A side (top, bottom, left, right, front, back) whose redstone signal stops the sandbox agent '
      .. 'while it is on, like "sandbox stop"',
    type = 'string',
  })
  settings.define('sandbox.turtle_budget', {
    description = 'Moves (forward, back, up, down) one sandbox ask may make with this turtle',
    type = 'number',
    default = M.TURTLE_BUDGET,
  })
end
]=])

loadModule('encoding', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/encoding: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Encodings ===================================================================
-- Owns: base64 (file content), payload and error coercion (SPEC §2), JSON lists, the default
-- JSON codec (textutils).
-- Needs: constants. Exports: M.base64Encode, M.base64Decode, M.coercePayload, M.coerceError.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect

--[[ Built for CraftOS's Lua, where making strings piecewise is slow (SPEC §6): output bytes are
collected as numbers and turned into strings with one string.char per BASE64_GROUP of them, and
the pieces joined with one table.concat. ]]
local BASE64_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
local BASE64_GROUP = 1024 -- about this many output bytes per string.char call
local base64Code, base64Value = {}, {}
for i = 1, 64 do
  local c = BASE64_ALPHABET:byte(i)
  base64Code[i - 1] = c
  base64Value[c] = i - 1
end
local PAD = ('='):byte()

local function flushCodes(out, codes, count)
  if count > 0 then out[#out + 1] = string.char(table.unpack(codes, 1, count)) end
  return 0
end

function M.base64Encode(data)
  expect(1, data, 'string')
  local byte, floor = string.byte, math.floor
  local code = base64Code
  local out, codes, k = {}, {}, 0
  local n = #data
  local full = n - n % 3
  for i = 1, full, 3 do
    local a, b, c = byte(data, i, i + 2)
    local v = a * 65536 + b * 256 + c
    codes[k + 1] = code[floor(v / 262144)]
    codes[k + 2] = code[floor(v / 4096) % 64]
    codes[k + 3] = code[floor(v / 64) % 64]
    codes[k + 4] = code[v % 64]
    k = k + 4
    if k >= BASE64_GROUP then k = flushCodes(out, codes, k) end
  end
  local rest = n - full
  if rest > 0 then
    local a, b = byte(data, full + 1, n)
    local v = a * 65536 + (b or 0) * 256
    codes[k + 1] = code[floor(v / 262144)]
    codes[k + 2] = code[floor(v / 4096) % 64]
    codes[k + 3] = rest == 2 and code[floor(v / 64) % 64] or PAD
    codes[k + 4] = PAD
    k = k + 4
  end
  flushCodes(out, codes, k)
  return table.concat(out)
end

-- base64Decode(text) -> bytes | nil, message. Whitespace is ignored; padding is required.
function M.base64Decode(text)
  expect(1, text, 'string')
  if text:find('%s') then text = text:gsub('%s+', '') end
  local n = #text
  if n % 4 ~= 0 then return nil, 'base64 length is not a multiple of 4' end
  local byte, floor = string.byte, math.floor
  local value = base64Value
  local out, codes, k = {}, {}, 0
  for i = 1, n, 4 do
    local a, b, c, d = byte(text, i, i + 3)
    local va, vb, vc, vd = value[a], value[b], value[c], value[d]
    local last = i + 3 == n
    if not (va and vb) then return nil, 'not base64 at byte ' .. i end
    if last and d == PAD then
      if c == PAD then
        codes[k + 1] = floor((va * 262144 + vb * 4096) / 65536)
        k = k + 1
      elseif vc then
        local v = va * 262144 + vb * 4096 + vc * 64
        codes[k + 1] = floor(v / 65536)
        codes[k + 2] = floor(v / 256) % 256
        k = k + 2
      else
        return nil, 'not base64 at byte ' .. (i + 2)
      end
    else
      if not (vc and vd) then return nil, 'not base64 at byte ' .. i end
      local v = va * 262144 + vb * 4096 + vc * 64 + vd
      codes[k + 1] = floor(v / 65536)
      codes[k + 2] = floor(v / 256) % 256
      codes[k + 3] = v % 256
      k = k + 3
    end
    if k >= BASE64_GROUP then k = flushCodes(out, codes, k) end
  end
  flushCodes(out, codes, k)
  return table.concat(out)
end

-- A JSON object decodes to a table with only string keys. Anything else (missing, `[]` which
-- CraftOS decodes to the frozen `textutils.empty_json_array`, a list, a scalar) reads as {}.
-- Always returns a table the caller may modify.
function M.coercePayload(payload)
  if type(payload) ~= 'table' then return {} end
  if next(payload) == nil then return {} end
  for k in pairs(payload) do
    if type(k) ~= 'string' then return {} end
  end
  return payload
end

function M.coerceError(err, fallbackMessage)
  if type(err) == 'table' and type(err.code) == 'string' and err.code ~= '' then
    return errorValue(err.code, type(err.message) == 'string' and err.message or '')
  end
  return errorValue('internal', fallbackMessage or 'request failed without an error')
end

-- An empty list as CraftOS encodes it as a JSON list ([]), where textutils can; {} otherwise,
-- which the gateway reads as an empty list too (SPEC §2, payload coercion).
local function jsonList(list)
  if #list == 0 then
    local tu = rawget(_G, 'textutils')
    if type(tu) == 'table' and type(tu.empty_json_array) == 'table' then return tu.empty_json_array end
  end
  return list
end

local function defaultEncode(value)
  return textutils.serializeJSON(value)
end

local function defaultDecode(text)
  return textutils.unserializeJSON(text)
end

internal.jsonList = jsonList
internal.defaultEncode = defaultEncode
internal.defaultDecode = defaultDecode
]=])

loadModule('wire', [[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/wire: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Envelopes ===================================================================
-- Owns: the four wire frames (SPEC §2), hello, traposId, messageIds, the URL nonce.
-- Needs: constants, encodings. Exports: M.traposId, M.computerRequest, M.computerResponse,
-- M.gatewayRequest, M.gatewayResponse, M.hello, M.newMessageId, M.withNonce.

local M, internal = ...
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty
local jsonList = internal.jsonList

-- traposId = "<computerId>:<label>", label may be empty ("7:").
function M.traposId(osLike)
  osLike = osLike or os
  expect(1, osLike, 'table')
  local id = osLike.getComputerID()
  local label = osLike.getComputerLabel and osLike.getComputerLabel() or nil
  return ('%d:%s'):format(id, label or '')
end
-- The four events differ only in their name and in which side's traposId they carry.
-- The builders tail-call these, so argument errors still name the builder's caller.
local function requestFrame(event, idKey, id, messageId, msgType, payload)
  expectNonEmpty(1, id)
  expectNonEmpty(2, messageId)
  expectNonEmpty(3, msgType)
  expect(4, payload, 'table', 'nil')
  return {
    event = event, [idKey] = id, messageId = messageId, type = msgType,
    payload = M.coercePayload(payload),
  }
end

local function responseFrame(event, idKey, id, messageId, msgType, ok, payload, err)
  expectNonEmpty(1, id)
  expectNonEmpty(2, messageId)
  expectNonEmpty(3, msgType)
  expect(4, ok, 'boolean')
  local frame = { event = event, [idKey] = id, messageId = messageId, type = msgType, ok = ok }
  if ok then frame.payload = M.coercePayload(payload) else frame.error = M.coerceError(err) end
  return frame
end

function M.computerRequest(senderId, messageId, msgType, payload)
  return requestFrame('computer_request', 'traposSenderId', senderId, messageId, msgType, payload)
end

function M.computerResponse(senderId, messageId, msgType, ok, payload, err)
  return responseFrame('computer_response', 'traposSenderId', senderId, messageId, msgType, ok, payload, err)
end

function M.gatewayRequest(receiverId, messageId, msgType, payload)
  return requestFrame('gateway_request', 'traposReceiverId', receiverId, messageId, msgType, payload)
end

function M.gatewayResponse(receiverId, messageId, msgType, ok, payload, err)
  return responseFrame('gateway_response', 'traposReceiverId', receiverId, messageId, msgType, ok, payload, err)
end

-- What this client does beyond the first protocol, announced in hello (`features`) so the
-- gateway knows what it may send: a temporary file per write (part.writeId), move_file and
-- make_folder, and file parts as binary messages where the socket carries them (and several
-- whole files in one: write_files). A gateway older than this ignores the list.
M.FEATURES = { 'write_id', 'move_file', 'make_folder' }

-- Whether file parts cross as binary websocket messages (docs/protocol.md): CC:Tweaked's
-- websockets send and receive them byte for byte; CraftOS-PC keeps base64 parts in JSON.
function M.binaryParts()
  local host = rawget(_G, '_HOST')
  return not (type(host) == 'string' and host:find('CraftOS-PC', 1, true))
end

local function features()
  local list = { table.unpack(M.FEATURES) }
  if M.binaryParts() then
    list[#list + 1] = 'binary_parts'
    list[#list + 1] = 'write_files'
  end
  return list
end

-- capabilities: the allowed list (§9).
-- `stopped` (optional): the error value saying why the player stopped the agent here (SPEC
-- §16); hello then carries stopped = true and its message, so the gateway knows at once.
function M.hello(senderId, messageId, secret, version, capabilities, stopped)
  expectNonEmpty(1, senderId)
  expect(3, secret, 'string', 'nil')
  expect(5, capabilities, 'table', 'nil')
  expect(6, stopped, 'table', 'nil')
  local payload = {
    traposId = senderId,
    secret = secret or '',
    version = version or _VERSION,
    capabilities = jsonList(capabilities or {}),
    features = jsonList(features()),
  }
  if stopped then payload.stopped, payload.stopMessage = true, stopped.message end
  return M.computerRequest(senderId, messageId, 'hello', payload)
end

-- messageId = "<os.epoch('utc')>-<process-global sequence>"; the sequence lives in _G so
-- concurrent programs sharing one computer never mint the same id.
function M.newMessageId(osLike)
  osLike = osLike or os
  local seq = (rawget(_G, 'traposSandboxSeq') or 0) + 1
  rawset(_G, 'traposSandboxSeq', seq)
  local epoch = osLike.epoch and osLike.epoch('utc') or 0
  return ('%.0f-%d'):format(epoch, seq)
end

-- Adds a fresh nonce to a URL's query so websocket_* events of different attempts differ.
function M.withNonce(url, nonce)
  expect(1, url, 'string')
  local sep = url:find('?', 1, true) and '&' or '?'
  return url .. sep .. 'n=' .. tostring(nonce)
end
]])

loadModule('loop', [[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/loop: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Event loop ==================================================================
-- Owns: the built-in event loop for plain CraftOS (trapos's bootEventLoop interface) and
-- listening to every event (what a program started by exec or eval waits on).
-- Needs: constants. Exports: M.createEventLoop, M.PROGRAM_EVENTS.

local M, internal = ...
local expect = internal.expect

-- Adds `handler` to `list`; returns the function that removes it again.
local function addHandler(list, handler)
  local entry = { fn = handler }
  list[#list + 1] = entry
  return function()
    for i = #list, 1, -1 do
      if list[i] == entry then table.remove(list, i) end
    end
  end
end

-- Built-in event loop for plain CraftOS: the same interface as trapos's bootEventLoop.
function M.createEventLoop(osLike)
  osLike = osLike or os
  local handlers = {}
  local anyHandlers = {}
  local timers = {}
  local running = false
  local loop = {}

  function loop.register(event, handler)
    expect(1, event, 'string')
    expect(2, handler, 'function')
    local list = handlers[event]
    if not list then list = {}; handlers[event] = list end
    return addHandler(list, handler)
  end

  -- Every event, with its name first (what a program run by exec or eval waits on).
  function loop.registerAny(handler)
    expect(1, handler, 'function')
    return addHandler(anyHandlers, handler)
  end

  function loop.setTimeout(fn, seconds)
    expect(1, fn, 'function')
    expect(2, seconds, 'number')
    local id = osLike.startTimer(seconds)
    timers[id] = fn
    return function()
      if timers[id] then
        timers[id] = nil
        if osLike.cancelTimer then pcall(osLike.cancelTimer, id) end
      end
    end
  end

  function loop.dispatch(event, ...)
    if event == 'timer' then
      local id = ...
      local fn = timers[id]
      if fn then
        timers[id] = nil
        fn()
      end
    end
    local list = handlers[event]
    if list then
      local snapshot = {}
      for i = 1, #list do snapshot[i] = list[i] end
      for i = 1, #snapshot do snapshot[i].fn(...) end
    end
    if #anyHandlers > 0 then
      local snapshot = {}
      for i = 1, #anyHandlers do snapshot[i] = anyHandlers[i] end
      for i = 1, #snapshot do snapshot[i].fn(event, ...) end
    end
  end

  -- Raw events: `terminate` is handed to the handlers (a program run by exec gets it) and never
  -- ends the loop. Every coroutine receives every terminate (SPEC §6): one typed into the
  -- computer by the gateway's `input`, or Ctrl+T meant for the shell the daemon runs beside,
  -- must not stop the daemon. It stops with the computer, or with stop().
  function loop.run()
    running = true
    local pull = osLike.pullEventRaw or osLike.pullEvent
    while running do
      loop.dispatch(pull())
    end
  end

  function loop.stop()
    running = false
  end

  return loop
end

local function dropEventName(name, ...)
  if select('#', ...) > 0 and (select(1, ...)) == name then
    return select(2, ...)
  end
  return ...
end

-- Event names for loops without registerAny (trapos's bootEventLoop): what programs wait on.
M.PROGRAM_EVENTS = {
  'alarm', 'char', 'computer_command', 'disk', 'disk_eject', 'file_transfer', 'http_check',
  'http_failure', 'http_success', 'key', 'key_up', 'modem_message', 'monitor_resize',
  'monitor_touch', 'mouse_click', 'mouse_drag', 'mouse_scroll', 'mouse_up', 'paste', 'peripheral',
  'peripheral_detach', 'rednet_message', 'redstone', 'speaker_audio_empty', 'task_complete',
  'term_resize', 'terminate', 'timer', 'turtle_inventory', 'websocket_closed', 'websocket_failure',
  'websocket_message', 'websocket_success', M.EVENT_REPLY, M.EVENT_CONNECTED,
}

local function listenAll(loop, handler)
  if type(loop.registerAny) == 'function' then
    return loop.registerAny(function(...) return handler(...) end)
  end
  local disposers = {}
  for _, name in ipairs(M.PROGRAM_EVENTS) do
    disposers[#disposers + 1] = loop.register(name, function(...) handler(name, dropEventName(name, ...)) end)
  end
  return function()
    for i = 1, #disposers do disposers[i]() end
  end
end

internal.dropEventName = dropEventName
internal.listenAll = listenAll
]])

loadModule('capture', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/capture: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Output capture and the terminal =============================================
-- Owns: what a program run by exec or eval prints (per stream, bounded), the redirect target
-- that records it while drawing where the player looks, the swapped write/printError.
-- Needs: constants. Exports: M.newCapture, M.TERM_METHODS.

local M, internal = ...

--[[ What a program run by exec or eval prints is recorded per stream, up to maxBytes each
(the rest is dropped and the stream flagged truncated), and queued for partial responses.
It is caught at two depths while the program runs (only then):
  - _G.write and _G.printError are swapped for capturedWrite / capturedPrintError, so print
    and write land in stdout with their own newlines and printError in stderr;
  - the program's terminal is a redirect that draws on the daemon's terminal (the player sees
    it) and records term.write / term.blit calls made outside write, a row change or a scroll
    standing for a newline.
`depth` > 0 while inside the swapped functions, so their own term calls are not recorded twice. ]]
local Capture = {}
Capture.__index = Capture

function M.newCapture(maxBytes, mergeStderr)
  local function stream() return { pieces = {}, bytes = 0, truncated = false } end
  return setmetatable({
    max = maxBytes or M.MAX_OUTPUT_BYTES, merge = mergeStderr, depth = 0, row = nil,
    stdout = stream(), stderr = stream(), pending = {},
  }, Capture)
end

function Capture:record(name, text)
  if text == '' then return end
  if self.merge then name = 'stdout' end
  local stream = self[name]
  local room = self.max - stream.bytes
  if room <= 0 then stream.truncated = true; return end
  if #text > room then
    text = text:sub(1, room)
    stream.truncated = true
  end
  stream.pieces[#stream.pieces + 1] = text
  stream.bytes = stream.bytes + #text
  local last = self.pending[#self.pending]
  if last and last.name == name then
    last.pieces[#last.pieces + 1] = text
    last.bytes = last.bytes + #text
  else
    self.pending[#self.pending + 1] = { name = name, pieces = { text }, bytes = #text }
  end
end

function Capture:text(name)
  return table.concat(self[name].pieces)
end

-- The oldest pending run of one stream, at most `limit` bytes of it: name, data (or nil).
function Capture:takePending(limit)
  local run = self.pending[1]
  if not run then return nil end
  local data = table.concat(run.pieces)
  if #data > limit then
    run.pieces, run.bytes = { data:sub(limit + 1) }, #data - limit
    data = data:sub(1, limit)
  else
    table.remove(self.pending, 1)
  end
  return run.name, data
end

--[[ The methods of CraftOS's terminal (term.native() once term.lua has moved
nativePaletteColour and screenshot onto `term`): CC:Tweaked's TermMethods, then CraftOS-PC's
graphics-mode extras. A terminal built over another takes its parent's methods by these names,
by indexing: a parent that is a wrapper (`setmetatable({write = ...}, {__index = ...})`, as
screen recorders and multiplexers make them) has most of its methods behind `__index`, where
`pairs` never looks. A name the parent lacks stays absent, so term.redirect treats the new
terminal as it would the parent: CraftOS-PC lends the native graphics methods, and a missing
standard method becomes its "Redirect object is missing method X." stub. ]]
M.TERM_METHODS = {
  'write', 'scroll', 'setCursorPos', 'setCursorBlink', 'getCursorPos', 'getCursorBlink',
  'getSize', 'clear', 'clearLine', 'setTextColour', 'setTextColor', 'setBackgroundColour',
  'setBackgroundColor', 'isColour', 'isColor', 'getTextColour', 'getTextColor',
  'getBackgroundColour', 'getBackgroundColor', 'blit', 'setPaletteColour', 'setPaletteColor',
  'getPaletteColour', 'getPaletteColor',
  'setGraphicsMode', 'getGraphicsMode', 'setPixel', 'getPixel', 'drawPixels', 'getPixels',
  'showMouse', 'relativeMouse', 'setFrozen', 'getFrozen',
  -- A window's own, passed on when the parent is one (a program may ask its terminal for them).
  'getLine', 'setVisible', 'isVisible', 'redraw', 'restoreCursor', 'getPosition', 'reposition',
}

-- A redirect target drawing on `parent` (each of its M.TERM_METHODS) that records what is written.
function Capture:terminal(parent)
  local cap = self
  local t = {}
  for _, name in ipairs(M.TERM_METHODS) do
    if type(parent[name]) == 'function' then t[name] = function(...) return parent[name](...) end end
  end
  if parent.getCursorPos then
    local ok, _, y = pcall(parent.getCursorPos)
    if ok then cap.row = y end
  end
  function t.write(text)
    if cap.depth == 0 then cap:record('stdout', tostring(text)) end
    return parent.write(text)
  end
  function t.blit(text, fg, bg)
    if cap.depth == 0 then cap:record('stdout', tostring(text)) end
    return parent.blit(text, fg, bg)
  end
  function t.setCursorPos(x, y)
    if cap.depth == 0 and cap.row ~= nil and y ~= cap.row then cap:record('stdout', '\n') end
    cap.row = y
    return parent.setCursorPos(x, y)
  end
  function t.scroll(n)
    if cap.depth == 0 and type(n) == 'number' and n >= 1 then cap:record('stdout', ('\n'):rep(n)) end
    return parent.scroll(n)
  end
  return t
end

-- Set by the jobs module while it resumes a job: `capture`, the job's capture; `write` and
-- `printError`, what _G held when a job last started running.
local swapped = { capture = nil, write = nil, printError = nil }

local function capturedWrite(text)
  local cap = swapped.capture
  if cap and cap.depth == 0 and (type(text) == 'string' or type(text) == 'number') then
    cap:record('stdout', tostring(text))
    cap.depth = cap.depth + 1
    local lines = swapped.write and swapped.write(text) or 0
    cap.depth = cap.depth - 1
    return lines
  end
  if swapped.write then return swapped.write(text) end
  return 0
end

local function capturedPrintError(...)
  local cap = swapped.capture
  if cap and cap.depth ~= 0 then cap = nil end
  if cap then
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    cap:record('stderr', table.concat(parts, '\t') .. '\n')
    cap.depth = cap.depth + 1
  end
  if swapped.printError then swapped.printError(...) end
  if cap then cap.depth = cap.depth - 1 end
end

internal.swapped = swapped
internal.capturedWrite = capturedWrite
internal.capturedPrintError = capturedPrintError
]=])

loadModule('screen', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/screen: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The screen ==================================================================
-- Owns: making the computer's screen readable however the daemon started (a recorder over the
-- native terminal, installed once), and screen_watch's streams of changed rows (SPEC §14).
-- Needs: constants, capture (M.TERM_METHODS). Exports: M.installRecorder, M.newRecorder,
-- M.compactRow, M.RECORDER_GLOBAL, M.MAX_WATCHES, M.SCREEN_WATCH_FPS.

local M, internal = ...

--[[ The native terminal cannot be read back. The recorder wraps the native terminal's drawing
methods in place: each one (taken from the native table by name, M.RECORDED_METHODS) draws
exactly as before and then mirrors what it drew into a buffer of lines and blit colours, and
tells the watches which rows changed.

Why in place, and not a window redirect: everything that reaches the screen goes through the
native table's methods, looked up at each call — term.lua's own redirect target, the windows
multishell and the installer's startup made over it before the daemon started, a program that
calls term.native() itself — so all of it is recorded, and every redirect keeps working as
before. A window over term.native() would repaint the screen when made (the player would see it
cleared), would not see what others draw on the native terminal directly and would later paint
its stale copy over it. The player sees exactly what they saw: every call is passed on first.
What was drawn before the recorder was installed is not known (blank) until it is redrawn,
unless the terminal the daemon started in is a readable window of the whole screen, which seeds
it.

Installed once per computer: _G[M.RECORDER_GLOBAL] holds the recorder, and a second daemon or a
reloaded library reuses it rather than wrapping the wrappers. ]]
M.RECORDER_GLOBAL = 'traposSandboxRecorder'
M.RECORDED_METHODS = {
  'write', 'blit', 'clear', 'clearLine', 'scroll', 'setCursorPos', 'setCursorBlink',
  'setPaletteColour', 'setPaletteColor',
}
M.MAX_WATCHES = 4                 -- screen_watch requests at once (overloaded past that)
M.SCREEN_WATCH_FPS = 10           -- default maxFps; at most 20

local BLIT_DIGITS = '0123456789abcdef'

-- A colour (a power of two, colours.white = 1 ... colours.black = 32768) as its blit digit.
local function blitDigit(colour)
  local bit = 0
  colour = type(colour) == 'number' and colour or 1
  while colour >= 2 and bit < 15 do
    colour = colour / 2
    bit = bit + 1
  end
  return BLIT_DIGITS:sub(bit + 1, bit + 1)
end

-- `s` written into `line` (`width` cells) from column `x`, clipped to the line.
local function splice(line, x, s, width)
  local first, last = x, x + #s - 1
  if first < 1 then first = 1 end
  if last > width then last = width end
  if first > last then return line end
  return line:sub(1, first - 1) .. s:sub(first - x + 1, last - x + 1) .. line:sub(last + 1)
end

--[[ A row as screen_watch sends it: each of line, text and background with its final run of one
character cut to a single one (a string shorter than the width continues with its last
character), so a short line in one colour costs its text and two characters of colour, and a
one-row change of a 51x19 screen fits in 300 bytes on the wire. ]]
function M.compactRow(line, text, background)
  local function cut(s)
    local last = s:sub(-1)
    local stop = #s
    while stop > 1 and s:sub(stop - 1, stop - 1) == last do stop = stop - 1 end
    return s:sub(1, stop)
  end
  return { line = cut(line), text = cut(text), background = cut(background) }
end

--[[ newRecorder(native) -> recorder: the buffer and the wrapped methods (recorder.wrapped), not
yet installed. recorder: getSize(), getLine(y) -> line, text, background, getCursorPos(),
getCursorBlink(), palette() -> 16 "#rrggbb" (blit digit order), sync() (picks up a resize),
watch(w) -> unwatch(): w.rows[y] = true for each changed row, w.paletteChanged = true, and
w:poke() on every change (cursor moves and blink included). ]]
function M.newRecorder(native)
  local parent = {}
  for _, name in ipairs(M.TERM_METHODS) do
    if type(native[name]) == 'function' then parent[name] = native[name] end
  end
  local rec = { native = native, parent = parent, watchers = {}, wrapped = {} }
  local width, height = parent.getSize()
  local lines, texts, backs = {}, {}, {}
  local cursorX, cursorY, blink = nil, nil, nil

  local function colours()
    local fg = parent.getTextColour or parent.getTextColor
    local bg = parent.getBackgroundColour or parent.getBackgroundColor
    return blitDigit(fg and fg() or 1), blitDigit(bg and bg() or 32768)
  end
  local function notify(row, palette)
    for watcher in pairs(rec.watchers) do
      if row then watcher.rows[row] = true end
      if palette then watcher.paletteChanged = true end
      watcher:poke()
    end
  end
  local function fill(row, fg, bg)
    local changed = lines[row] ~= (' '):rep(width) or texts[row] ~= fg:rep(width) or backs[row] ~= bg:rep(width)
    lines[row], texts[row], backs[row] = (' '):rep(width), fg:rep(width), bg:rep(width)
    if changed then notify(row) end
  end
  local function put(x, y, s, f, b)
    if y < 1 or y > height or #s == 0 then return end
    local line, text, back = splice(lines[y], x, s, width), splice(texts[y], x, f, width), splice(backs[y], x, b, width)
    if line ~= lines[y] or text ~= texts[y] or back ~= backs[y] then
      lines[y], texts[y], backs[y] = line, text, back
      notify(y)
    end
  end
  local function blankAll()
    local fg, bg = colours()
    for row = 1, height do lines[row], texts[row], backs[row] = (' '):rep(width), fg:rep(width), bg:rep(width) end
  end
  blankAll()

  local w = rec.wrapped
  function w.write(text)
    local x, y = parent.getCursorPos()
    local r = table.pack(parent.write(text))
    local s = tostring(text)
    local fg, bg = colours()
    put(x, y, s, fg:rep(#s), bg:rep(#s))
    return table.unpack(r, 1, r.n)
  end
  function w.blit(text, fg, bg)
    local x, y = parent.getCursorPos()
    local r = table.pack(parent.blit(text, fg, bg))
    if type(text) == 'string' and type(fg) == 'string' and type(bg) == 'string' then
      put(x, y, text, fg:lower(), bg:lower())
    end
    return table.unpack(r, 1, r.n)
  end
  function w.clear()
    local r = table.pack(parent.clear())
    local fg, bg = colours()
    for row = 1, height do fill(row, fg, bg) end
    return table.unpack(r, 1, r.n)
  end
  function w.clearLine()
    local r = table.pack(parent.clearLine())
    local _, y = parent.getCursorPos()
    if y >= 1 and y <= height then
      local fg, bg = colours()
      fill(y, fg, bg)
    end
    return table.unpack(r, 1, r.n)
  end
  function w.scroll(n)
    local r = table.pack(parent.scroll(n))
    n = type(n) == 'number' and math.floor(n) or 0
    if n ~= 0 then
      local fg, bg = colours()
      local blank, blankFg, blankBg = (' '):rep(width), fg:rep(width), bg:rep(width)
      local newLines, newTexts, newBacks = {}, {}, {}
      for row = 1, height do
        local from = row + n
        if from >= 1 and from <= height then
          newLines[row], newTexts[row], newBacks[row] = lines[from], texts[from], backs[from]
        else
          newLines[row], newTexts[row], newBacks[row] = blank, blankFg, blankBg
        end
      end
      for row = 1, height do
        local changed = newLines[row] ~= lines[row] or newTexts[row] ~= texts[row] or newBacks[row] ~= backs[row]
        lines[row], texts[row], backs[row] = newLines[row], newTexts[row], newBacks[row]
        if changed then notify(row) end
      end
    end
    return table.unpack(r, 1, r.n)
  end
  -- A cursor set where it already is (window.restoreCursor after every event) is no change:
  -- an idle screen must not wake the watches.
  function w.setCursorPos(x, y)
    local r = table.pack(parent.setCursorPos(x, y))
    if x ~= cursorX or y ~= cursorY then
      cursorX, cursorY = x, y
      notify()
    end
    return table.unpack(r, 1, r.n)
  end
  function w.setCursorBlink(on)
    local r = table.pack(parent.setCursorBlink(on))
    if on ~= blink then
      blink = on
      notify()
    end
    return table.unpack(r, 1, r.n)
  end
  local function setPalette(name)
    return function(...)
      local r = table.pack(parent[name](...))
      notify(nil, true)
      return table.unpack(r, 1, r.n)
    end
  end
  w.setPaletteColour, w.setPaletteColor = setPalette('setPaletteColour'), setPalette('setPaletteColor')
  for name in pairs(w) do
    if not parent[name] then w[name] = nil end
  end

  -- A terminal resized since (CraftOS-PC's window, term_resize): the buffer follows, all rows
  -- changed.
  function rec.sync()
    local newWidth, newHeight = parent.getSize()
    if newWidth == width and newHeight == height then return false end
    local fg, bg = colours()
    for row = 1, newHeight do
      local line, text, back = lines[row] or '', texts[row] or '', backs[row] or ''
      local pad = newWidth - #line
      if pad > 0 then
        line, text, back = line .. (' '):rep(pad), text .. fg:rep(pad), back .. bg:rep(pad)
      end
      lines[row], texts[row], backs[row] = line:sub(1, newWidth), text:sub(1, newWidth), back:sub(1, newWidth)
    end
    for row = newHeight + 1, height do lines[row], texts[row], backs[row] = nil, nil, nil end
    width, height = newWidth, newHeight
    for row = 1, height do notify(row) end
    return true
  end
  function rec.getSize() return width, height end
  function rec.getLine(y) return lines[y], texts[y], backs[y] end
  function rec.getCursorPos() return parent.getCursorPos() end
  function rec.getCursorBlink()
    if parent.getCursorBlink then return parent.getCursorBlink() == true end
    return blink == true
  end
  function rec.palette()
    local list = {}
    local get = parent.getPaletteColour or parent.getPaletteColor
    for i = 0, 15 do
      local hex = '#000000'
      if get then
        local ok, r, g, b = pcall(get, 2 ^ i)
        if ok and type(r) == 'number' then
          hex = ('#%02x%02x%02x'):format(math.floor(r * 255 + 0.5), math.floor(g * 255 + 0.5), math.floor(b * 255 + 0.5))
        end
      end
      list[i + 1] = hex
    end
    return list
  end
  -- Rows drawn before the recorder existed, from a readable terminal of the whole screen.
  function rec.seed(readable)
    if type(readable) ~= 'table' or type(readable.getLine) ~= 'function' or type(readable.getSize) ~= 'function' then return end
    local ok, w2, h2 = pcall(readable.getSize)
    if not ok or w2 ~= width or h2 ~= height then return end
    for row = 1, height do
      local okLine, line, text, back = pcall(readable.getLine, row)
      if okLine and type(line) == 'string' and #line == width and type(text) == 'string' and #text == width
        and type(back) == 'string' and #back == width then
        lines[row], texts[row], backs[row] = line, text, back
      end
    end
  end
  function rec.watch(watcher)
    rec.watchers[watcher] = true
    return function() rec.watchers[watcher] = nil end
  end
  return rec
end

-- The recorder of `termApi`'s native terminal, installed once per computer; nil when there is
-- no native terminal to record.
function M.installRecorder(termApi)
  if type(termApi) ~= 'table' or type(termApi.native) ~= 'function' then return nil end
  local ok, native = pcall(termApi.native)
  if not ok or type(native) ~= 'table' or type(native.getSize) ~= 'function' or type(native.getCursorPos) ~= 'function' then
    return nil
  end
  local rec = rawget(_G, M.RECORDER_GLOBAL)
  if type(rec) == 'table' and rec.native == native and type(rec.getLine) == 'function' then return rec end
  rec = M.newRecorder(native)
  if termApi.current then
    local okCurrent, current = pcall(termApi.current)
    if okCurrent and current ~= native then rec.seed(current) end
  end
  for name, fn in pairs(rec.wrapped) do native[name] = fn end
  rawset(_G, M.RECORDER_GLOBAL, rec)
  return rec
end

--[[ A screen_watch: the first partial carries the whole screen (every row, width, height, the
cursor, cursorBlink and the palette); each later one only what changed since the one before —
the changed rows (M.compactRow), cursorX and cursorY always, width, height, cursorBlink and
palette when they changed. A draw arms one timer (none while nothing changes), so partials are
at least 1000 / maxFps ms apart and coalesce every draw in between. It ends when cancelled or
when its connection ends. ]]
local Watch = {}
Watch.__index = Watch

function Watch:poke()
  if self.done or self.clearTimer then return end
  local session = self.session
  local wait = self.lastFrame and (self.lastFrame + self.interval - session.clock()) or 0
  if wait < 0 then wait = 0 end
  self.clearTimer = session.loop.setTimeout(function()
    self.clearTimer = nil
    if not self.done then self:frame(false) end
  end, wait / 1000)
end

function Watch:frame(first)
  local rec, sent = self.recorder, self.sent
  rec.sync()
  local width, height = rec.getSize()
  local cursorX, cursorY = rec.getCursorPos()
  local blink = rec.getCursorBlink()
  local payload = { type = 'screen', cursorX = cursorX, cursorY = cursorY }
  local changed = first or cursorX ~= sent.cursorX or cursorY ~= sent.cursorY
  if first or width ~= sent.width or height ~= sent.height then
    payload.width, payload.height, changed = width, height, true
  end
  if first or blink ~= sent.cursorBlink then payload.cursorBlink, changed = blink, true end
  if first then
    for y = 1, height do self.rows[y] = true end
    self.paletteChanged = true
  end
  local rows = {}
  for y in pairs(self.rows) do
    if y >= 1 and y <= height then
      rows[tostring(y)] = M.compactRow(rec.getLine(y))
      changed = true
    end
  end
  payload.rows = rows
  if self.paletteChanged then payload.palette, changed = rec.palette(), true end
  self.rows, self.paletteChanged = {}, false
  if not changed then return end
  self.req.partial(payload)
  self.lastFrame = self.session.clock()
  sent.width, sent.height, sent.cursorX, sent.cursorY, sent.cursorBlink = width, height, cursorX, cursorY, blink
end

-- Ends the watch: `cancel` answers `cancelled`; the end of its connection answers nothing
-- anyone can receive. Returns whether it was running.
function Watch:stop(reason)
  if self.done then return false end
  self.done = true
  self.unwatch()
  if self.clearTimer then self.clearTimer(); self.clearTimer = nil end
  local session = self.session
  session.watches[self.req.messageId] = nil
  session.watchCount = session.watchCount - 1
  if reason == 'cancel' then
    self.req.respond(false, nil, M.errorValue('cancelled', 'cancelled by the gateway'))
  elseif reason == 'stopped' then
    self.req.respond(false, nil, session:stopReason() or M.errorValue('stopped', 'stopped on the computer'))
  else
    self.req.respond(false, nil, M.errorValue('not_connected', 'the connection ended'))
  end
  return true
end

-- Starts a screen_watch of `recorder` for `req` on `session`, at most maxFps frames a second.
local function startWatch(session, req, recorder, maxFps)
  if session.watches[req.messageId] then
    return req.respond(false, nil, M.errorValue('bad_request', 'a request with this messageId is running'))
  end
  if session.watchCount >= M.MAX_WATCHES then
    return req.respond(false, nil, M.errorValue('overloaded', ('%d screen watches are running already'):format(session.watchCount)))
  end
  local watch = setmetatable({
    session = session, req = req, recorder = recorder, attempt = session.current,
    interval = 1000 / maxFps, rows = {}, paletteChanged = false, sent = {}, done = false,
  }, Watch)
  session.watches[req.messageId] = watch
  session.watchCount = session.watchCount + 1
  watch.unwatch = recorder.watch(watch)
  watch:frame(true)
end

-- Stops the watches started on `attempt` (all watches when nil), for `reason` (default
-- 'disconnect').
local function stopWatches(session, attempt, reason)
  local list = {}
  for _, watch in pairs(session.watches) do
    if attempt == nil or watch.attempt == attempt then list[#list + 1] = watch end
  end
  for _, watch in ipairs(list) do watch:stop(reason or 'disconnect') end
end

internal.startWatch = startWatch
internal.stopWatches = stopWatches
]=])

loadModule('jobs', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/jobs: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Jobs ========================================================================
-- Owns: a program (exec) or a Lua chunk (eval) running in its own coroutine beside the daemon:
-- resuming it with its terminal and capture in place, timeout, cancel, streamed partials.
-- Needs: constants, event loop, capture. Exports: nothing (startJob and stopJobs, for the
-- request handlers and the session).

local M, internal = ...
local capturedPrintError = internal.capturedPrintError
local capturedWrite = internal.capturedWrite
local errorValue = internal.errorValue
local listenAll = internal.listenAll
local swapped = internal.swapped

--[[ A job is resumed from the daemon's event loop like `parallel` resumes its coroutines: with
every event that matches the filter it yielded (all events when none), and `terminate` always.
On timeoutMs, cancel, or the end of its connection it is resumed once with `terminate`; if it
has not ended M.TERMINATE_GRACE s later it is abandoned. Output streams back as partial
responses, coalesced; before the final answer whatever is still buffered is sent, so the
partials always carry the whole captured output and the final answer repeats it. ]]
local Job = {}
Job.__index = Job

local function startJob(session, req, spec)
  if session.jobs[req.messageId] then
    return req.respond(false, nil, errorValue('bad_request', 'a request with this messageId is running'))
  end
  if session.jobCount >= M.MAX_JOBS then
    return req.respond(false, nil, errorValue('overloaded', ('%d programs are running already'):format(session.jobCount)))
  end
  local job = setmetatable({
    session = session, req = req, spec = spec, attempt = session.current,
    capture = M.newCapture(spec.maxOutputBytes, spec.mergeStderr),
    co = coroutine.create(spec.body), dir = spec.cwd, startedAt = session.clock(),
    done = false, filter = nil, stopReason = nil, lastPartial = nil,
  }, Job)
  if session.term and session.term.current and session.term.redirect then
    -- Draw where the player looks: the recorded screen (the shell's), else our own terminal.
    local ok, parent = pcall(session.screen)
    if not ok or type(parent) ~= 'table' then ok, parent = pcall(session.term.current) end
    if ok and type(parent) == 'table' then job.term = job.capture:terminal(parent) end
  end
  session.jobs[req.messageId] = job
  session.jobCount = session.jobCount + 1
  job.dispose = listenAll(session.loop, function(...) job:onEvent(...) end)
  job.clearTimeout = session.loop.setTimeout(function()
    job.clearTimeout = nil
    job:stop('timeout')
  end, spec.timeoutMs / 1000)
  job:resume()
end

-- Stops the jobs started on `attempt` (all jobs when nil), for `reason` (default 'disconnect').
local function stopJobs(session, attempt, reason)
  local list = {}
  for _, job in pairs(session.jobs) do
    if attempt == nil or job.attempt == attempt then list[#list + 1] = job end
  end
  for _, job in ipairs(list) do job:stop(reason or 'disconnect') end
end

function Job:onEvent(event, ...)
  if self.done then return end
  if self.filter == nil or self.filter == event or event == 'terminate' then
    self:resume(event, ...)
  end
end

-- One resume, with the program's terminal, output capture and working directory in place
-- and everything put back afterwards.
function Job:resume(...)
  if self.done then return end
  local session = self.session
  local termApi, shellApi = session.term, session.shell
  local prevTerm
  if self.term then
    prevTerm = termApi.current()
    termApi.redirect(self.term)
  end
  local prevWrite, prevPrintError = rawget(_G, 'write'), rawget(_G, 'printError')
  if prevWrite ~= capturedWrite then swapped.write = prevWrite; rawset(_G, 'write', capturedWrite) end
  if prevPrintError ~= capturedPrintError then swapped.printError = prevPrintError; rawset(_G, 'printError', capturedPrintError) end
  local prevDir
  if shellApi and self.dir then
    prevDir = shellApi.dir()
    pcall(shellApi.setDir, self.dir)
  end
  local prevCapture = swapped.capture
  swapped.capture = self.capture
  self.capture.depth = 0

  local result = table.pack(coroutine.resume(self.co, ...))

  swapped.capture = prevCapture
  if prevDir then
    self.dir = shellApi.dir()
    pcall(shellApi.setDir, prevDir)
  end
  if rawget(_G, 'write') == capturedWrite then rawset(_G, 'write', prevWrite) end
  if rawget(_G, 'printError') == capturedPrintError then rawset(_G, 'printError', prevPrintError) end
  if prevTerm then
    self.term = termApi.current()
    termApi.redirect(prevTerm)
  end

  if coroutine.status(self.co) == 'dead' then
    self:finish(result)
  else
    if result[1] then self.filter = result[2] end
    self:flushOutput(false)
  end
end

-- Sends pending output as partials: at once when the last partial is M.PARTIAL_INTERVAL_MS
-- old or the run holds M.PARTIAL_MIN_BYTES; otherwise one timer sends it later.
function Job:flushOutput(force)
  local session, cap = self.session, self.capture
  while cap.pending[1] do
    local now = session.clock()
    local wait = self.lastPartial and (self.lastPartial + M.PARTIAL_INTERVAL_MS - now) or 0
    if not force and wait > 0 and cap.pending[1].bytes < M.PARTIAL_MIN_BYTES then
      if not self.clearFlush then
        self.clearFlush = session.loop.setTimeout(function()
          self.clearFlush = nil
          if not self.done then self:flushOutput(false) end
        end, wait / 1000)
      end
      return
    end
    local name, data = cap:takePending(M.PARTIAL_MAX_BYTES)
    self.req.partial({ type = name .. '_delta', data = data })
    self.lastPartial = now
  end
end

function Job:stop(reason)
  if self.done then return false end
  if reason == 'cancel' or not self.stopReason then self.stopReason = reason end
  self:resume('terminate')
  if not self.done and not self.clearGrace then
    self.clearGrace = self.session.loop.setTimeout(function()
      self.clearGrace = nil
      self.abandoned = true
      self:finish({ false, 'still running after terminate: abandoned', n = 2 })
    end, M.TERMINATE_GRACE)
  end
  return true
end

-- Halves the longest output string of an answer that does not fit in one frame.
local function shrinkOutput(answer)
  local holder, key, longest = nil, nil, 0
  local function consider(t, k)
    if type(t[k]) == 'string' and #t[k] > longest then holder, key, longest = t, k, #t[k] end
  end
  consider(answer, 'stdout')
  consider(answer, 'stderr')
  if type(answer.returns) == 'table' then
    for i = 1, #answer.returns do consider(answer.returns, i) end
  end
  if not holder or longest < 2 then return false end
  holder[key] = holder[key]:sub(1, math.floor(longest / 2))
  if holder == answer then answer[key .. 'Truncated'] = true end
  return true
end

function Job:finish(result)
  if self.done then return end
  self.done = true
  local session = self.session
  if self.dispose then self.dispose() end
  for _, clear in ipairs({ 'clearTimeout', 'clearGrace', 'clearFlush' }) do
    if self[clear] then self[clear](); self[clear] = nil end
  end
  session.jobs[self.req.messageId] = nil
  session.jobCount = session.jobCount - 1
  local answer, failure = self.spec.answer(self, result)
  self:flushOutput(true)
  if self.stopReason == 'cancel' then
    self.req.respond(false, nil, errorValue('cancelled', 'cancelled by the gateway'))
  elseif self.stopReason == 'stopped' then
    self.req.respond(false, nil, self.session:stopReason() or errorValue('stopped', 'stopped on the computer'))
  elseif failure then
    self.req.respond(false, nil, failure)
  else
    self.req.respond(true, answer, nil, shrinkOutput)
  end
end

function Job:durationMs()
  return math.max(0, math.floor(self.session.clock() - self.startedAt))
end

internal.startJob = startJob
internal.stopJobs = stopJobs
]=])

loadModule('handlers', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/handlers: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Request handlers ============================================================
-- Owns: the registration of request types (registerRequest), what every request handler
-- shares (answers, numbers and lists from a payload, paths, /.settings refused) and ping. The
-- other handlers are in exec, files, snapshot, console and peripherals, each registered where
-- it is defined; sandbox/requests makes the request table of the registrations.
-- Needs: constants, encodings. Exports: M.isSettingsPath, M.SETTINGS_FILE; for the other
-- handlers: registerRequest, badRequest, fsError, errorText, sessionOf, optionalNumber,
-- stringList, resolvePath, settingsForbidden, filePath, encodingOk; for sandbox/requests:
-- closeRequests; for tests: foldedSettingsPath.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty

--[[ A handler is handler(req, ctx), registered with its type and capability by
registerRequest; sandbox/requests puts them in the request table (M.requestHandlers).
req = { messageId, type, payload (coerced), respond(ok, payload, err, shrink?) -> sent,
        partial(payload) -> sent }
ctx = the context onMessage was given (traposId, send, ... and, in a session, `session` and
`allowed(capability)`).
A handler answers through req.respond, at once or later (exec and eval stream partials first).
A handler that raises is answered with `internal`; a type missing from the table with
`unknown_type`; a type whose capability the owner has not allowed with `forbidden` (dispatch).
An answer that would encode over M.MAX_SEND is sent as `too_large` instead (after `shrink`, when
given, could not make it fit). ]]

-- Every request type the daemon answers, registered where its handler is defined:
-- type -> { capability = the name sandbox.allow must hold (nil: none), handler = fn }.
local registered, closed = {}, false

-- A gateway request type (SPEC §9 has its payload and answer), the capability it needs (nil for
-- none) and its handler. A type registered twice, or after the table was made, is an error.
local function registerRequest(msgType, capability, handler)
  expectNonEmpty(1, msgType)
  expect(2, capability, 'string', 'nil')
  expect(3, handler, 'function')
  if closed then
    error('request type ' .. msgType .. ' registered after the request table was made', 2)
  end
  if registered[msgType] then error('request type ' .. msgType .. ' registered twice', 2) end
  registered[msgType] = { capability = capability, handler = handler }
end

-- The registrations, once (sandbox/requests makes the request table of them); no more after.
local function closeRequests()
  closed = true
  return registered
end

local function handlePing(req, ctx)
  req.respond(true, { traposId = ctx.traposId })
end
-- ping: {traposId}
registerRequest('ping', nil, handlePing)

local function badRequest(req, message)
  req.respond(false, nil, errorValue('bad_request', message))
end

local function fsError(req, message)
  req.respond(false, nil, errorValue('fs_error', message))
end

-- CraftOS's own message, without a "file:line:" prefix a Lua error may carry.
local function errorText(err)
  local text = tostring(err)
  return (text:gsub('^[^%s:]+:%d+: ', ''))
end

local function sessionOf(req, ctx)
  if type(ctx.session) ~= 'table' then
    req.respond(false, nil, errorValue('internal', 'no sandbox session'))
    return nil
  end
  return ctx.session
end

local function optionalNumber(payload, key, default, min, max)
  local value = payload[key]
  if value == nil then return default end
  if type(value) ~= 'number' or value ~= value or value < min then
    return nil, ('%s must be a number of at least %d'):format(key, min)
  end
  if max and value > max then value = max end
  return math.floor(value)
end

-- A list field may arrive as {} or textutils.empty_json_array when empty (SPEC §2).
local function stringList(value, key)
  if value == nil then return {} end
  if type(value) ~= 'table' then return nil, key .. ' must be a list of strings' end
  local list = {}
  for i = 1, #value do
    if type(value[i]) ~= 'string' then return nil, key .. ' must be a list of strings' end
    list[i] = value[i]
  end
  for k in pairs(value) do
    if type(k) ~= 'number' or k < 1 or k > #value or k % 1 ~= 0 then return nil, key .. ' must be a list of strings' end
  end
  return list
end

-- A CraftOS path from payload[key]: absolute, or relative to payload.cwd (default /; the
-- cwd itself is relative to /). Returns the fs path ('' for the root) and the display path
-- ('/...'), or nil, message.
local function resolvePath(fsApi, payload, key, required)
  local path = payload[key]
  if path == nil and not required then path = '' end
  if type(path) ~= 'string' then return nil, key .. ' must be a string' end
  local cwd = key ~= 'cwd' and payload.cwd or nil
  if cwd ~= nil and type(cwd) ~= 'string' then return nil, 'cwd must be a string' end
  local full
  if path:sub(1, 1) == '/' or path:sub(1, 1) == '\\' then
    full = fsApi.combine('', path)
  else
    full = fsApi.combine(fsApi.combine('', cwd or ''), path)
  end
  return full, '/' .. full
end

--[[ The computer's credential stays on it (SPEC §9): /.settings holds sandbox.password, so
file requests may not read, list, write or delete it. CraftOS normalises a path before it
touches the disk, and differently in CC:Tweaked (fs.combine keeps `*`; fs.open drops it) and
CraftOS-PC (drops `"*:<>?|`, control and non-ASCII bytes, then folds `..`, trims spaces, drops
all-dot parts, cuts a long last part at 255), on hosts whose names may ignore case and trailing
dots and spaces. So a path is the settings file when, folded with the illegal characters
dropped before or after folding, its first part is `.settings` in any case with any trailing
dots or spaces (or a part of 255 bytes or more starting with it): the file, or a path under it
(which would make a folder of that name where the settings are saved). `..` above the root
stays at the root. The gateway refuses the same paths (trapsandbox/settingsfile.py, its twin). ]]
M.SETTINGS_FILE = '.settings'
local PATH_DROPPED = '[%c\128-\255"*:<>?|]'

local function foldPath(path)
  local parts = {}
  for raw in path:gmatch('[^/\\]+') do
    local part = raw:gsub('^[%c ]+', ''):gsub('[%c ]+$', '')
    if part == '..' then
      parts[#parts] = nil
    elseif part ~= '' and not part:find('^%.+$') then
      parts[#parts + 1] = part
    end
  end
  return parts
end

local function namesSettings(parts)
  if #parts == 0 then return false end
  local name = parts[1]:lower()
  if #name >= 255 then return name:sub(1, #M.SETTINGS_FILE) == M.SETTINGS_FILE end
  return (name:gsub('[%. ]+$', '')) == M.SETTINGS_FILE
end

-- The rule itself, on a path made absolute (see isSettingsPath): the parts of `joined` with the
-- dropped bytes removed before folding, and after.
local function foldedSettingsPath(joined)
  local folded = table.concat(foldPath(joined), '/')
  return namesSettings(foldPath((joined:gsub(PATH_DROPPED, ''))))
    or namesSettings(foldPath((folded:gsub(PATH_DROPPED, ''))))
end

-- Whether `path` (absolute, or relative to `cwd`, itself relative to /) is /.settings.
function M.isSettingsPath(path, cwd)
  local first = path:sub(1, 1)
  local joined = path
  if first ~= '/' and first ~= '\\' then joined = (cwd or '') .. '/' .. path end
  --[[ Most paths are decided without folding. With no byte that is dropped (PATH_DROPPED),
  dropping changes nothing, before or after folding, and folding a folded path again gives the
  same parts; so both checks below read the parts of foldPath(joined). Each of those is a run
  of joined's bytes (split at separators, ends trimmed), and namesSettings is true only when
  the first starts with `.settings` in any case. So a path with no dropped byte and no
  `.settings` (any case) among its bytes is not the settings file: foldedSettingsPath would
  say false too. (tests/lua/modules/handlers.lua and tests/unit/computers/test_settingsfile.py
  compare the two.) ]]
  if not joined:find(PATH_DROPPED) and not joined:lower():find(M.SETTINGS_FILE, 1, true) then
    return false
  end
  return foldedSettingsPath(joined)
end

local function settingsForbidden(req, shown)
  req.respond(false, nil, errorValue('forbidden', shown .. ' is this computer\'s settings file and holds its '
    .. 'sandbox password: file requests may not read, list, write or delete it'))
end

-- The path of a file request from payload[key or 'path'] (see resolvePath), or nil once the
-- request has been answered: bad_request, or forbidden for the settings file.
local function filePath(req, fsApi, required, key)
  key = key or 'path'
  local path, shown = resolvePath(fsApi, req.payload, key, required)
  if not path then return badRequest(req, shown) end
  -- The path as sent and as resolved: one check when they are one string (absolute, so the
  -- cwd is not read: the same call), as a gateway's canonical path is.
  local sent = req.payload[key] or ''
  if M.isSettingsPath(sent, req.payload.cwd) or (sent ~= shown and M.isSettingsPath(shown)) then
    return settingsForbidden(req, shown)
  end
  return path, shown
end

-- `encoding`: base64 (in the JSON), or binary: a write's bytes came after its header in a
-- binary message (req.raw), a read's go back that way (req.respondBinary). -> 'base64' or
-- 'binary', or nil once answered.
local function encodingOk(req)
  local encoding = req.payload.encoding
  if encoding == nil or encoding == 'base64' then return 'base64' end
  if encoding == 'binary' and (req.raw or (req.type == 'read_file' and req.respondBinary)) then
    return 'binary'
  end
  badRequest(req, 'encoding must be "base64"' .. (req.respondBinary and ' or "binary"' or ''))
end

internal.registerRequest = registerRequest
internal.closeRequests = closeRequests
internal.badRequest = badRequest
internal.fsError = fsError
internal.errorText = errorText
internal.sessionOf = sessionOf
internal.optionalNumber = optionalNumber
internal.stringList = stringList
internal.resolvePath = resolvePath
internal.settingsForbidden = settingsForbidden
internal.filePath = filePath
internal.foldedSettingsPath = foldedSettingsPath
internal.encodingOk = encodingOk
]=])

loadModule('exec', [[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/exec: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Programs ====================================================================
-- Owns: exec (a program beside the daemon) and eval (a Lua chunk), run as jobs, and cancel.
-- Needs: constants, handlers, jobs. Exports: M.PROGRAM_PATH. Registers exec, eval and cancel
-- (registerRequest, sandbox/handlers).

local M, internal = ...
local badRequest = internal.badRequest
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local resolvePath = internal.resolvePath
local sessionOf = internal.sessionOf
local startJob = internal.startJob
local stringList = internal.stringList

local function timeoutAndOutput(payload)
  local timeoutMs, err = optionalNumber(payload, 'timeoutMs', M.EXEC_TIMEOUT_MS, 1)
  if not timeoutMs then return nil, err end
  local maxOutput
  maxOutput, err = optionalNumber(payload, 'maxOutputBytes', M.MAX_OUTPUT_BYTES, 0, M.MAX_OUTPUT_BYTES)
  if not maxOutput then return nil, err end
  return timeoutMs, maxOutput
end

-- exec without a shell (a daemon started with none): resolve like the shell and run the file.
M.PROGRAM_PATH = { '/rom/programs', '/rom/programs/http', '/rom/programs/advanced', '/rom/programs/fun', '/programs' }

local function findProgram(fsApi, command, cwd)
  local function found(path)
    if fsApi.exists(path) and not fsApi.isDir(path) then return path end
    if fsApi.exists(path .. '.lua') and not fsApi.isDir(path .. '.lua') then return path .. '.lua' end
  end
  if command:find('[/\\]') then
    if command:find('^[/\\]') then return found(fsApi.combine('', command)) end
    return found(fsApi.combine(cwd, command))
  end
  local hit = found(fsApi.combine(cwd, command))
  if hit then return hit end
  for _, dir in ipairs(M.PROGRAM_PATH) do
    hit = found(fsApi.combine(dir, command))
    if hit then return hit end
  end
end

local function runWithoutShell(fsApi, command, args, cwd)
  local report = function(message) local pe = rawget(_G, 'printError') or print; pe(message) end
  local path = findProgram(fsApi, command, cwd)
  if not path then report('No such program'); return false end
  local handle, openErr = fsApi.open(path, 'r')
  if not handle then report(openErr or ('cannot open ' .. path)); return false end
  local source = handle.readAll()
  handle.close()
  local env = setmetatable({ arg = { [0] = command, table.unpack(args) } }, { __index = _G })
  local fn, loadErr = load(source or '', '@/' .. path, 't', env)
  if not fn then report(loadErr); return false end
  local ok, err = pcall(fn, table.unpack(args))
  if not ok then
    if err ~= nil and err ~= '' then report(err) end
    return false
  end
  return true
end

local function execAnswer(job, result)
  local cap = job.capture
  -- An error that escaped the program (not printed by the shell) still goes to stderr.
  if not result[1] then cap:record('stderr', tostring(result[2]) .. '\n') end
  local answer = {
    exitCode = (result[1] and result[2] == true) and 0 or 1,
    timedOut = job.stopReason == 'timeout',
    durationMs = job:durationMs(),
    stdout = cap:text('stdout'),
    stderr = cap:text('stderr'),
  }
  if cap.stdout.truncated then answer.stdoutTruncated = true end
  if cap.stderr.truncated then answer.stderrTruncated = true end
  return answer
end

local function handleExec(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local payload, fsApi = req.payload, session.fs
  local command = payload.command
  if type(command) ~= 'string' or command == '' then return badRequest(req, 'command must be a non-empty string') end
  local args, err = stringList(payload.args, 'args')
  if not args then return badRequest(req, err) end
  local cwd
  cwd, err = resolvePath(fsApi, payload, 'cwd', false)
  if not cwd then return badRequest(req, err) end
  if not fsApi.isDir(cwd) then return badRequest(req, 'cwd /' .. cwd .. ' is not a directory') end
  local timeoutMs, maxOutput = timeoutAndOutput(payload)
  if not timeoutMs then return badRequest(req, maxOutput) end
  local shellApi = session.shell
  local body
  if shellApi and shellApi.execute then
    body = function() return shellApi.execute(command, table.unpack(args)) end
  else
    body = function() return runWithoutShell(fsApi, command, args, cwd) end
  end
  startJob(session, req, {
    body = body, cwd = shellApi and cwd or nil, timeoutMs = timeoutMs, maxOutputBytes = maxOutput,
    answer = execAnswer,
  })
end
-- exec: run a program beside the daemon; partials stream its output
registerRequest('exec', 'exec', handleExec)

local function serializeValue(textutilsApi, value)
  if textutilsApi and textutilsApi.serialize then
    local ok, text = pcall(textutilsApi.serialize, value)
    if ok and type(text) == 'string' then return text end
  end
  return tostring(value)
end

-- eval has one output stream: printError output goes to stdout too.
local function evalAnswer(job, result)
  local cap = job.capture
  local answer = {
    ok = result[1] == true and not job.abandoned,
    returns = {},
    stdout = cap:text('stdout'),
    durationMs = job:durationMs(),
    timedOut = job.stopReason == 'timeout',
  }
  if answer.ok then
    for i = 2, result.n do answer.returns[i - 1] = serializeValue(job.session.textutils, result[i]) end
  else
    answer.error = tostring(result[2])
  end
  answer.returns = jsonList(answer.returns)
  if cap.stdout.truncated then answer.stdoutTruncated = true end
  return answer
end

-- The environment eval code runs in: reads fall through to the computer's globals, assignments
-- stay here, and it lasts for the session (like the Lua prompt, `x = 1` then `return x` works).
local function evalEnv(session)
  if not session.evalGlobals then
    session.evalGlobals = setmetatable({ shell = session.shell, multishell = session.multishell }, { __index = _G })
  end
  return session.evalGlobals
end

local function handleEval(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local code = req.payload.code
  if type(code) ~= 'string' or code == '' then return badRequest(req, 'code must be a non-empty string') end
  local timeoutMs, maxOutput = timeoutAndOutput(req.payload)
  if not timeoutMs then return badRequest(req, maxOutput) end
  local env = evalEnv(session)
  -- Like the Lua prompt: an expression first, then statements.
  local fn, err = load('return ' .. code, '=eval', 't', env)
  if not fn then fn, err = load(code, '=eval', 't', env) end
  if not fn then
    return req.respond(true, { ok = false, returns = jsonList({}), stdout = '', error = tostring(err), durationMs = 0, timedOut = false })
  end
  startJob(session, req, {
    body = fn, timeoutMs = timeoutMs, maxOutputBytes = maxOutput, mergeStderr = true, answer = evalAnswer,
  })
end
-- eval: run Lua the same way; returns via textutils.serialize
registerRequest('eval', 'eval', handleEval)

local function handleCancel(req, ctx)
  local messageId = req.payload.messageId
  if type(messageId) ~= 'string' or messageId == '' then return badRequest(req, 'messageId must be a non-empty string') end
  local session = type(ctx.session) == 'table' and ctx.session or nil
  -- A running exec or eval (a job), or a screen_watch.
  local running = session and (session.jobs[messageId] or session.watches[messageId]) or nil
  req.respond(true, { cancelled = running ~= nil and running:stop('cancel') or false })
end
-- cancel: {messageId} of a running exec, eval or screen_watch
registerRequest('cancel', nil, handleCancel)
]])

loadModule('files', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/files: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Files =======================================================================
-- Owns: list_files, read_file, write_file (parts into a temporary file per write, the last one
-- moves it in; write_files: several whole files in one message), delete_file, move_file and
-- make_folder, each checked and done in one step.
-- Needs: constants, encodings, handlers. Exports: M.TEMP_SUFFIX; freeSpaceFor (snapshot).
-- Registers those seven request types.

local M, internal = ...
local badRequest = internal.badRequest
local encodingOk = internal.encodingOk
local errorText = internal.errorText
local filePath = internal.filePath
local fsError = internal.fsError
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local errorValue = internal.errorValue
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local settingsForbidden = internal.settingsForbidden

local function fileEntry(fsApi, dir, name)
  local full = fsApi.combine(dir, name)
  if fsApi.attributes then
    local ok, attrs = pcall(fsApi.attributes, full)
    if ok and type(attrs) == 'table' then
      return { name = name, type = attrs.isDir and 'dir' or 'file', size = attrs.isDir and 0 or (attrs.size or 0),
        readOnly = attrs.isReadOnly == true }
    end
  end
  local isDir = fsApi.isDir(full)
  return { name = name, type = isDir and 'dir' or 'file', size = isDir and 0 or fsApi.getSize(full),
    readOnly = fsApi.isReadOnly(full) == true }
end

local function handleListFiles(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = filePath(req, fsApi, false)
  if not path then return end
  if not fsApi.exists(path) then return fsError(req, shown .. ': No such file') end
  if not fsApi.isDir(path) then return fsError(req, shown .. ': Not a directory') end
  local ok, names = pcall(fsApi.list, path)
  if not ok then return fsError(req, errorText(names)) end
  local entries = {}
  for i, name in ipairs(names) do entries[i] = fileEntry(fsApi, path, name) end
  req.respond(true, { path = shown, entries = jsonList(entries) })
end
-- list_files: {path, entries}
registerRequest('list_files', 'fs.read', handleListFiles)

-- Reads `length` bytes from `offset` of an open binary handle.
local function readRange(handle, offset, length)
  if offset > 0 then
    if handle.seek then
      handle.seek('set', offset)
    else
      local skipped = 0
      while skipped < offset do
        local chunk = handle.read(math.min(offset - skipped, M.MAX_CONTENT))
        if not chunk or chunk == '' then break end
        skipped = skipped + #chunk
      end
    end
  end
  local parts, got = {}, 0
  while got < length do
    local chunk = handle.read(length - got)
    if not chunk or chunk == '' then break end
    parts[#parts + 1] = chunk
    got = got + #chunk
  end
  return table.concat(parts)
end

local function handleReadFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, payload = session.fs, req.payload
  local encoding = encodingOk(req)
  if not encoding then return end
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  local offset, err = optionalNumber(payload, 'offset', 0, 0)
  if not offset then return badRequest(req, err) end
  local most = encoding == 'binary' and M.MAX_BINARY_CONTENT or M.MAX_CONTENT
  local length
  length, err = optionalNumber(payload, 'length', most, 0, most)
  if not length then return badRequest(req, err) end
  if not fsApi.exists(path) then return fsError(req, shown .. ': No such file') end
  if fsApi.isDir(path) then return fsError(req, shown .. ': Is a directory') end
  local handle, openErr = fsApi.open(path, 'rb')
  if not handle then return fsError(req, openErr or (shown .. ': cannot open')) end
  local ok, data = pcall(readRange, handle, offset, length)
  handle.close()
  if not ok then return fsError(req, errorText(data)) end
  local answer = { encoding = encoding, sizeBytes = fsApi.getSize(path), offset = offset, bytesRead = #data }
  if encoding == 'binary' then return req.respondBinary(answer, data) end
  answer.content = M.base64Encode(data)
  req.respond(true, answer)
end
-- read_file: base64 (64 KiB) or binary (120 KiB) a part
registerRequest('read_file', 'fs.read', handleReadFile)

-- The free space of the drive `path` is on (or will be on): asked of its nearest existing folder.
-- (`folder`: fs.getDir(path), when the caller has it already.)
local function freeSpaceFor(fsApi, path, folder)
  if not fsApi.getFreeSpace then return nil, 0 end
  local dir, missing = folder or fsApi.getDir(path), 0
  while dir ~= '' and dir ~= '..' and not fsApi.exists(dir) do
    missing = missing + 1
    dir = fsApi.getDir(dir)
  end
  if dir == '..' then dir = '' end
  local ok, free = pcall(fsApi.getFreeSpace, dir)
  if ok and type(free) == 'number' then return free, missing end
  return nil, missing -- "unlimited", or not answerable
end

-- Writes `data` to `path` ('wb' or 'ab'); the handle is closed exactly once. -> ok, message
local function writeBytes(fsApi, path, mode, data)
  local handle, openErr = fsApi.open(path, mode)
  if not handle then return false, openErr or ('/' .. path .. ': cannot open') end
  local ok, err = true, nil
  if data ~= '' then ok, err = pcall(handle.write, data) end
  local closed, closeErr = pcall(handle.close)
  if ok and not closed then ok, err = false, closeErr end
  if not ok then return false, errorText(err) end
  return true
end

-- Moves `temp` onto `path`, so `path` is replaced whole or not at all. -> ok, message
local function install(fsApi, temp, path)
  local backup
  if fsApi.exists(path) then
    backup = temp .. '.old'
    if fsApi.exists(backup) then pcall(fsApi.delete, backup) end
    local ok, err = pcall(fsApi.move, path, backup)
    if not ok then return false, errorText(err) end
  end
  local ok, err = pcall(fsApi.move, temp, path)
  if not ok then
    if backup then pcall(fsApi.move, backup, path) end
    return false, errorText(err)
  end
  if backup then pcall(fsApi.delete, backup) end
  return true
end

M.TEMP_SUFFIX = '.sandbox-part'
-- A write whose last part came this long ago (the gateway waits 30 s for each) was abandoned:
-- the next write of that file deletes what it left.
M.STALE_WRITE_MS = 120000

--[[ Each write builds its file in a temporary file of its own beside the target, named with
the writeId the gateway sends with every part (`.<name>.<writeId>.sandbox-part`), so two
writes of one file at once never share one: each moves a whole file into place (install),
never parts of both. A gateway older than writeId sends none: the one shared name
`.<name>.sandbox-part` is used then. What a write abandoned is deleted by the next write of
that file (clearStaleTemps). `dir` is fs.getDir(path), which the caller has. ]]
local function tempName(fsApi, path, writeId, dir)
  local name = fsApi.getName(path)
  if writeId then
    local stem = '.' .. name .. '.'
    if #stem + #writeId + #M.TEMP_SUFFIX >= 255 then stem = '.' .. name:sub(1, 200) .. '.' end
    return fsApi.combine(dir, stem .. writeId .. M.TEMP_SUFFIX)
  end
  return fsApi.combine(dir, '.' .. name .. M.TEMP_SUFFIX)
end

local LEFTOVER = '^%..+%.%x+' .. M.TEMP_SUFFIX:gsub('%p', '%%%0') .. '$'

--[[ The writes under way are known to the daemon (session.writing: temp -> {path, heard: the
clock at its last part, attempt: the connection it came on}). Before a write starts, every
write that is no longer under way is forgotten and its temporary file deleted, whatever file
it was for: one of an earlier connection (the gateway's requests ended with it), or idle for
M.STALE_WRITE_MS (the gateway gave up between two parts); so the table holds only the writes
under way, and nothing waits for the computer to reconnect. What the daemon
did not write (left by a run before this one: the computer rebooted) is found by looking
through the folder once in the daemon's run (session.scanned): every write's temporary file
there that no write under way holds. ]]
local function clearStaleTemps(fsApi, session, path, dir)
  local writing, now = session.writing, session.clock()
  for temp, write in pairs(writing) do
    if write.attempt ~= session.current or now - write.heard >= M.STALE_WRITE_MS then
      writing[temp] = nil -- (clearing a field while pairs() walks the table is allowed)
      pcall(fsApi.delete, temp)
    end
  end
  local legacy = tempName(fsApi, path, nil, dir)
  if not writing[legacy] and fsApi.exists(legacy) then pcall(fsApi.delete, legacy) end
  session.scanned = session.scanned or {}
  if session.scanned[dir] or not fsApi.isDir(dir) then return end
  session.scanned[dir] = true
  local ok, names = pcall(fsApi.list, dir)
  if not ok then return end
  for _, name in ipairs(names) do
    local full = fsApi.combine(dir, name)
    if name:find(LEFTOVER) and not writing[full] then pcall(fsApi.delete, full) end
  end
end

local function handleWriteFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, payload = session.fs, req.payload
  local encoding = encodingOk(req)
  if not encoding then return end
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  if path == '' then return badRequest(req, 'path names a folder: /') end
  local data, most = req.raw, M.MAX_BINARY_CONTENT
  if encoding ~= 'binary' then
    if type(payload.content) ~= 'string' then return badRequest(req, 'content must be a base64 string') end
    local decodeErr
    data, decodeErr = M.base64Decode(payload.content)
    if not data then return badRequest(req, 'content: ' .. decodeErr) end
    most = M.MAX_CONTENT
  end
  if #data > most then
    return badRequest(req, ('%d bytes in one frame, at most %d: send parts'):format(#data, most))
  end
  local part = payload.part
  if part ~= nil and type(part) ~= 'table' then return badRequest(req, 'part must be {offset, final, size?}') end
  local offset, final, size, writeId = 0, true, #data, nil
  if part then
    local err
    offset, err = optionalNumber(part, 'offset', 0, 0)
    if not offset then return badRequest(req, 'part.' .. err) end
    final = part.final == true
    size, err = optionalNumber(part, 'size', offset + #data, offset + #data)
    if not size then return badRequest(req, 'part.' .. err) end
    writeId = part.writeId
    if writeId ~= nil and (type(writeId) ~= 'string' or not writeId:find('^%x+$') or #writeId > 32) then
      return badRequest(req, 'part.writeId must be at most 32 hex digits')
    end
  end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  if fsApi.isDir(path) then return fsError(req, shown .. ': Cannot write to directory') end
  -- A whole new file in one part goes straight to its place: there is no old file to keep,
  -- and nothing runs between this handler's open and close (fs calls do not yield).
  local direct = offset == 0 and final and not fsApi.exists(path)
  -- (fs.getDir is a function of the path alone: asked once, for every use below.)
  local dir = fsApi.getDir(path)

  -- Parts go to this write's temporary file beside the target; offset 0 starts it afresh.
  session.writing = session.writing or {}
  local writing = session.writing
  local temp, have = nil, 0
  if direct then
    if writeId then clearStaleTemps(fsApi, session, path, dir) end
  else
    temp = tempName(fsApi, path, writeId, dir)
    if M.isSettingsPath('/' .. temp) or M.isSettingsPath('/' .. temp .. '.old') then return settingsForbidden(req, shown) end
    if offset > 0 then
      have = fsApi.exists(temp) and fsApi.getSize(temp) or 0
      if offset ~= have then
        -- Left as it is, and still known (clearStaleTemps deletes it once it is stale, or the
        -- connection ends), should the part that follows on come after all.
        return badRequest(req, ('part.offset is %d but %d bytes of %s were received so far'):format(offset, have, shown))
      end
    else
      -- What a write abandoned half-way left (the gateway gone, the computer rebooted): ours.
      if writeId then writing[temp] = nil; clearStaleTemps(fsApi, session, path, dir) end
      if fsApi.exists(temp) then pcall(fsApi.delete, temp) end
    end
    if writeId then writing[temp] = { path = path, heard = session.clock(), attempt = session.current } end
  end
  local function done() if temp then writing[temp] = nil end end
  -- The space is known before anything is touched: with the first part, for the whole file
  -- (part.size, from a gateway that sends it), beside the file it replaces, which stays
  -- until the new one is whole (CC:Tweaked counts a file as at least FILE_OVERHEAD bytes).
  local free, missingDirs = freeSpaceFor(fsApi, path, dir)
  local need = #data
  if offset == 0 then need = math.max(size, M.FILE_OVERHEAD) + missingDirs * M.FILE_OVERHEAD end
  if free and need > free then
    if offset > 0 then pcall(fsApi.delete, temp) end
    done()
    local kept = fsApi.exists(path) and (shown .. ' is unchanged') or 'nothing was written'
    return fsError(req, ('Out of space: writing %s needs %d bytes, %d free (%s)'):format(shown, need, free, kept))
  end
  -- (Where the free space was asked, its folder was found there unless some were missing.)
  if (missingDirs > 0 or not free) and dir ~= '' and not fsApi.exists(dir) then
    local ok, err = pcall(fsApi.makeDir, dir)
    if not ok then done(); return fsError(req, errorText(err)) end
  end
  local ok, err = writeBytes(fsApi, direct and path or temp, offset == 0 and 'wb' or 'ab', data)
  if not ok then
    pcall(fsApi.delete, direct and path or temp)
    done()
    return fsError(req, err)
  end
  local size = have + #data
  if direct then
    done()
  elseif final then
    done()
    ok, err = install(fsApi, temp, path)
    if not ok then
      pcall(fsApi.delete, temp)
      return fsError(req, err)
    end
    size = fsApi.getSize(path)
  end
  req.respond(true, { bytesWritten = #data, sizeBytes = size })
end
-- write_file: parts into a temporary file, the final one moves it in
registerRequest('write_file', 'fs.write', handleWriteFile)

--[[ write_files {encoding = 'binary', writeId, files = {{path, size}, ...}}, as one binary
message whose bytes are the files' one after another: several whole files in one request (a
snapshot's restore), each written exactly as a write_file of one part writes it, in order,
stopping at the first that fails. -> {written = {{path, sizeBytes}}, failed? = {path, code,
message}}: the files before a failure stay written. ]]
local function handleWriteFiles(req, ctx)
  local payload, raw = req.payload, req.raw
  if payload.encoding ~= 'binary' or type(raw) ~= 'string' then
    return badRequest(req, 'write_files comes as a binary message (encoding "binary")')
  end
  local files = payload.files
  if type(files) ~= 'table' then return badRequest(req, 'files must be a list of {path, size}') end
  if #files > M.MAX_BATCH_FILES then
    return badRequest(req, ('at most %d files in one write_files'):format(M.MAX_BATCH_FILES))
  end
  local total = 0
  for i, file in ipairs(files) do
    local size = type(file) == 'table' and file.size
    if type(size) ~= 'number' or size < 0 or size % 1 ~= 0 then
      return badRequest(req, ('files[%d].size must be a whole number of bytes'):format(i))
    end
    total = total + size
  end
  if total ~= #raw then
    return badRequest(req, ('the files add up to %d bytes, but %d came'):format(total, #raw))
  end
  local written, at = {}, 1
  for _, file in ipairs(files) do
    local answer = {}
    local one = { messageId = req.messageId, type = 'write_file', raw = raw:sub(at, at + file.size - 1),
      payload = { path = file.path, encoding = 'binary',
        part = { offset = 0, final = true, size = file.size, writeId = payload.writeId } } }
    function one.respond(ok, result, err)
      answer.ok, answer.result, answer.err = ok, result, err
      return true
    end
    at = at + file.size
    local ran, err = pcall(handleWriteFile, one, ctx)
    if not ran and answer.ok == nil then answer.ok, answer.err = false, errorValue('internal', tostring(err)) end
    if not answer.ok then
      local err = answer.err or {}
      return req.respond(true, { written = jsonList(written),
        failed = { path = tostring(file.path), code = err.code, message = err.message } })
    end
    written[#written + 1] = { path = file.path, sizeBytes = answer.result.sizeBytes }
  end
  req.respond(true, { written = jsonList(written) })
end
-- write_files: several whole files in one binary message
registerRequest('write_files', 'fs.write', handleWriteFiles)

local function handleDeleteFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  if path == '' then return badRequest(req, 'refusing to delete /') end
  if not fsApi.exists(path) then return req.respond(true, { deleted = false }) end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  local ok, err = pcall(fsApi.delete, path)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { deleted = not fsApi.exists(path) })
end
-- delete_file: {deleted}
registerRequest('delete_file', 'fs.write', handleDeleteFile)

-- A path of a move or a folder (see resolvePath) from payload[key], or nil once answered.
local function changedPath(req, fsApi, key)
  local path, shown = filePath(req, fsApi, true, key)
  if not path then return end
  if path == '' then return badRequest(req, key .. ' is the root folder, which cannot be changed') end
  if path == '..' or path:sub(1, 3) == '../' then return badRequest(req, key .. ' goes above the root folder') end
  return path, shown
end

local function within(child, parent)
  return child == parent or child:sub(1, #parent + 1) == parent .. '/'
end

--[[ move_file {from, to} -> {moved = true, from, to}: a file or a folder (with all in it) to a
path that does not exist yet, its missing folders made. Checked and done in one step, with no
yield between (fs calls do not yield), so nothing can be saved into `from` or made at `to`
between the check and the move, and nothing is deleted but by the move itself. Refused: `to`
inside `from` (or the same), `to` existing, either read-only, /.settings. ]]
local function handleMoveFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local from, fromShown = changedPath(req, fsApi, 'from')
  if not from then return end
  local to, toShown = changedPath(req, fsApi, 'to')
  if not to then return end
  if within(to, from) then return badRequest(req, ('to (%s) must not be from (%s) or inside it'):format(toShown, fromShown)) end
  if not fsApi.exists(from) then return fsError(req, fromShown .. ': No such file') end
  if fsApi.exists(to) then return fsError(req, toShown .. ': File exists') end
  if fsApi.isReadOnly(from) then return fsError(req, fromShown .. ': Access denied') end
  if fsApi.isReadOnly(to) then return fsError(req, toShown .. ': Access denied') end
  local dir = fsApi.getDir(to)
  if dir ~= '' and not fsApi.exists(dir) then
    local ok, err = pcall(fsApi.makeDir, dir)
    if not ok then return fsError(req, errorText(err)) end
  end
  local ok, err = pcall(fsApi.move, from, to)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { moved = true, from = fromShown, to = toShown })
end
-- move_file: {from, to}: checked and moved in one step
registerRequest('move_file', 'fs.write', handleMoveFile)

--[[ make_folder {path} -> {made, existed}: the folder and any missing above it (fs.makeDir);
one that exists already is left as it is (existed = true). Never deletes anything. ]]
local function handleMakeFolder(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = changedPath(req, fsApi, 'path')
  if not path then return end
  if fsApi.isDir(path) then return req.respond(true, { made = shown, existed = true }) end
  if fsApi.exists(path) then return fsError(req, shown .. ': File exists') end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  local ok, err = pcall(fsApi.makeDir, path)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { made = shown, existed = false })
end
-- make_folder: {path}: made, or left as it is
registerRequest('make_folder', 'fs.write', handleMakeFolder)

internal.freeSpaceFor = freeSpaceFor
]=])

loadModule('snapshot', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/snapshot: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Snapshots ===================================================================
-- Owns: snapshot_list (SPEC §15): every file a snapshot takes, outside /rom, drives and
-- /.settings. Needs: constants, handlers, files. Registers snapshot_list.

local M, internal = ...
local errorValue = internal.errorValue
local freeSpaceFor = internal.freeSpaceFor
local jsonList = internal.jsonList
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf

M.SNAPSHOT_BATCH = 64    -- paths looked at between yields while listing for a snapshot
-- Bytes a listed file adds to the answer's JSON besides its path (keys, numbers, quotes).
M.SNAPSHOT_ENTRY_BYTES = 64

-- Whether a snapshot leaves `path` (an fs path, '' for the root) out: /rom and other
-- read-only paths, mounted drives (anything not on the computer's own disk), /.settings.
local function snapshotSkips(fsApi, path)
  if path == '' then return false end
  if M.isSettingsPath('/' .. path) then return true end
  if fsApi.getDrive then
    local ok, drive = pcall(fsApi.getDrive, path)
    if not ok or drive ~= 'hdd' then return true end
  end
  local ok, readOnly = pcall(fsApi.isReadOnly, path)
  return not ok or readOnly == true
end

-- {isDir, size, modified (ms)} of `path`, or nil when it vanished meanwhile.
local function snapshotAttributes(fsApi, path)
  if fsApi.attributes then
    local ok, attrs = pcall(fsApi.attributes, path)
    if not ok or type(attrs) ~= 'table' then return nil end
    return attrs.isDir == true, attrs.size or 0, math.floor(attrs.modified or attrs.modification or 0)
  end
  if not fsApi.exists(path) then return nil end
  if fsApi.isDir(path) then return true, 0, 0 end
  return false, fsApi.getSize(path), 0
end

--[[ snapshot_list {} -> {files: [{path, size, modified}], total, free?}: every file a snapshot
holds, and the free bytes of the computer's disk.
The walk looks at M.SNAPSHOT_BATCH paths, then waits for a 0 s timer (the daemon's loop may not
block, and CraftOS kills code that runs ~7 s without yielding), so a disk of hundreds of files
never stalls other requests. The answer is one frame: a listing that would not fit is refused
with too_large, plainly. ]]
local function handleSnapshotList(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, attempt = session.fs, session.current
  local files, total, bytes = {}, 0, 256
  local pending = { '' }
  local function step()
    if session.current ~= attempt or (attempt and attempt.done) then return end -- connection gone
    for _ = 1, M.SNAPSHOT_BATCH do
      local path = table.remove(pending)
      if path == nil then break end
      if not snapshotSkips(fsApi, path) then
        local isDir, size, modified = snapshotAttributes(fsApi, path)
        if isDir then
          local ok, names = pcall(fsApi.list, path)
          if ok then
            for i = #names, 1, -1 do pending[#pending + 1] = fsApi.combine(path, names[i]) end
          end
        elseif isDir == false then
          files[#files + 1] = { path = '/' .. path, size = size, modified = modified }
          total = total + size
          bytes = bytes + #path + M.SNAPSHOT_ENTRY_BYTES
        end
      end
    end
    if #pending > 0 then return session.loop.setTimeout(step, 0) end
    if bytes > M.MAX_SEND then
      return req.respond(false, nil, errorValue('too_large', ('this computer has %d files: their list '
        .. 'does not fit in one %d-byte frame, so no snapshot can be taken (delete some files)'):format(#files, M.MAX_SEND)))
    end
    -- free: what a restore may use (the gateway checks a whole restore fits before it starts).
    local free = freeSpaceFor(fsApi, 'x')
    req.respond(true, { files = jsonList(files), total = total, free = free })
  end
  step()
end
-- snapshot_list: {files: [{path, size, modified}], total}, all but /rom, drives, /.settings (§15)
registerRequest('snapshot_list', 'fs.read', handleSnapshotList)
]=])

loadModule('console', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/console: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Screen and input ===========================================================
-- Owns: screen, screen_watch (the screen, then its changes as partials) and input (keys, chars,
-- paste, mouse, terminate) (SPEC §14). Needs: constants, the screen, handlers.
-- Exports: M.NO_SCREEN; isWhole. Registers screen, screen_watch and input.

local M, internal = ...
local badRequest = internal.badRequest
local errorValue = internal.errorValue
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local startWatch = internal.startWatch

--[[ The screen is the daemon's recorder of the native terminal (sandbox/screen, installed when the
daemon starts, however it was started). A session without one (no term.native, or started
with `recorder = false`) falls back to a readable terminal (one with getLine, i.e. a window)
recorded in _G.traposSandboxScreen, as older installers' startup files did. ]]
M.NO_SCREEN = 'this computer has no readable screen: the sandbox daemon could not record its terminal '
  .. '(no term.native)'

local function readableScreen(session)
  if session.recorder then
    session.recorder.sync()
    return session.recorder
  end
  local screen = session.screen()
  if type(screen) == 'table' and type(screen.getLine) == 'function' and type(screen.getSize) == 'function' then
    return screen
  end
end

local function handleScreen(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local screen = readableScreen(session)
  if not screen then return req.respond(false, nil, errorValue('internal', M.NO_SCREEN)) end
  local width, height = screen.getSize()
  local cursorX, cursorY = 1, 1
  if screen.getCursorPos then cursorX, cursorY = screen.getCursorPos() end
  local lines, text, background = {}, {}, {}
  for y = 1, height do
    local line, fg, bg = screen.getLine(y)
    lines[y] = line or ''
    text[y] = fg
    background[y] = bg
  end
  local answer = { width = width, height = height, cursorX = cursorX, cursorY = cursorY, lines = lines }
  if #text == height then answer.text = text end
  if #background == height then answer.background = background end
  req.respond(true, answer)
end
-- screen: the whole screen's lines and colours
registerRequest('screen', 'screen', handleScreen)

-- screen_watch {maxFps?}: partials until cancelled or the connection ends (see Watch).
local function handleScreenWatch(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local maxFps, err = optionalNumber(req.payload, 'maxFps', M.SCREEN_WATCH_FPS, 1, 20)
  if not maxFps then return badRequest(req, err) end
  if not session.recorder then return req.respond(false, nil, errorValue('internal', M.NO_SCREEN)) end
  startWatch(session, req, session.recorder, maxFps)
end
-- screen_watch: the screen, then its changes as partials (§14)
registerRequest('screen_watch', 'screen', handleScreenWatch)

-- Input (SPEC §14) ----------------------------------------------------------------------

M.MAX_INPUT_EVENTS = 256 -- events in one input request (bad_request past that)
M.INPUT_BATCH = 32       -- events queued before the daemon waits for the queue to drain

local function keyCode(name)
  local keysApi = rawget(_G, 'keys')
  local code = type(name) == 'string' and type(keysApi) == 'table' and keysApi[name] or nil
  if type(code) == 'number' then return code end
end

local function isWhole(value) return type(value) == 'number' and value == math.floor(value) end

-- {button | direction, x, y} as the mouse event `name`'s parameters.
local function mouseEvent(name, first, allowed)
  return function(value)
    if type(value) ~= 'table' or not (isWhole(value.x) and isWhole(value.y)) then
      return nil, ('needs {%s, x, y} with whole numbers'):format(first)
    end
    if not allowed[value[first]] then return nil, ('%s must be one of %s'):format(first, allowed.text) end
    return { name, value[first], value.x, value.y }
  end
end

-- Each input kind: its JSON key -> a check that returns the CraftOS event, or nil, message.
local INPUT_KINDS = {
  char = function(value)
    if type(value) == 'string' and #value == 1 then return { 'char', value } end
    return nil, 'char must be one character'
  end,
  key = function(value, event)
    local code = keyCode(value)
    if not code then return nil, 'unknown key name ' .. tostring(value) end
    if event.held ~= nil and type(event.held) ~= 'boolean' then return nil, 'held must be true or false' end
    return { 'key', code, event.held == true }
  end,
  keyUp = function(value)
    local code = keyCode(value)
    if not code then return nil, 'unknown key name ' .. tostring(value) end
    return { 'key_up', code }
  end,
  paste = function(value)
    if type(value) == 'string' then return { 'paste', value } end
    return nil, 'paste must be a string'
  end,
  terminate = function(value)
    if value == true then return { 'terminate' } end
    return nil, 'terminate must be true'
  end,
  mouseClick = mouseEvent('mouse_click', 'button', { true, true, true, text = '1, 2, 3' }),
  mouseUp = mouseEvent('mouse_up', 'button', { true, true, true, text = '1, 2, 3' }),
  mouseScroll = mouseEvent('mouse_scroll', 'direction', { [-1] = true, [1] = true, text = '-1, 1' }),
}

-- One input event -> the CraftOS event to queue, or nil, message.
local function inputEvent(event)
  if type(event) ~= 'table' then return nil, 'must be an object' end
  local kind
  for key in pairs(event) do
    if INPUT_KINDS[key] then
      if kind then return nil, 'has both ' .. kind .. ' and ' .. key end
      kind = key
    elseif not (key == 'held' and event.key ~= nil) then
      return nil, 'unknown field ' .. tostring(key)
    end
  end
  if not kind then return nil, 'needs one of char, key, keyUp, paste, terminate, mouseClick, mouseUp, mouseScroll' end
  return INPUT_KINDS[kind](event[kind], event)
end

--[[ input {events}: every event is checked before any is queued (a bad one is bad_request
naming it, counted from 0 as in the JSON list). They are queued in order, M.INPUT_BATCH at a
time: after each batch the daemon arms a 0 s timer and queues the next batch when it fires. The
timer's event is queued behind the batch, so by then every event of the batch has left the
computer's queue (it drops events past 256); at most M.INPUT_BATCH + 1 of ours are in it at
once. The daemon's own loop is not a handler that may block (os.sleep would eat the events other
handlers wait for), hence the timer. Answer {queued}. ]]
local function handleInput(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local events = req.payload.events
  if events == nil then events = {} end
  if type(events) ~= 'table' then return badRequest(req, 'events must be a list') end
  for k in pairs(events) do
    if not isWhole(k) or k < 1 or k > #events then return badRequest(req, 'events must be a list') end
  end
  if #events > M.MAX_INPUT_EVENTS then
    return badRequest(req, ('%d events, at most %d in one request'):format(#events, M.MAX_INPUT_EVENTS))
  end
  local queue = {}
  for i = 1, #events do
    local event, err = inputEvent(events[i])
    if not event then return badRequest(req, ('events[%d] %s'):format(i - 1, err)) end
    queue[i] = event
  end
  local attempt, nextEvent = session.current, 1
  local function batch()
    if session.current ~= attempt or (attempt and attempt.done) then return end -- connection gone
    local last = math.min(nextEvent + M.INPUT_BATCH - 1, #queue)
    for i = nextEvent, last do session:queue(table.unpack(queue[i])) end
    nextEvent = last + 1
    if nextEvent > #queue then return req.respond(true, { queued = #queue }) end
    session.loop.setTimeout(batch, 0)
  end
  batch()
end
-- input: {events}: keys, chars, paste, mouse, terminate (§14)
registerRequest('input', 'input', handleInput)

internal.isWhole = isWhole
]=])

loadModule('peripherals', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/peripherals: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Peripherals and turtles =====================================================
-- Owns: list_peripherals, call_peripheral, peripheral_events and turtle (SPEC §16): a Lua
-- value as JSON, calls that may yield, the turtle's move budget.
-- Needs: constants, encodings, loop, jobs, handlers, console. Registers those four request
-- types.

local M, internal = ...
local badRequest = internal.badRequest
local dropEventName = internal.dropEventName
local errorText = internal.errorText
local errorValue = internal.errorValue
local isWhole = internal.isWhole
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local startJob = internal.startJob
local stringList = internal.stringList

--[[ A Lua value as JSON: strings, booleans and finite numbers as they are; tables as arrays
(keys exactly 1..n) or objects (other keys as text); nil inside a list as null; functions,
coroutines, userdata, NaN and infinities, cycles and tables nested deeper than M.JSON_DEPTH
as their type name ("function", "table"), so any peripheral's answer can be sent. ]]
local function jsonNull()
  local textutilsApi = rawget(_G, 'textutils')
  return textutilsApi and textutilsApi.json_null or nil
end

local function toJsonValue(value, seen, depth)
  local t = type(value)
  if t == 'string' or t == 'boolean' then return value end
  if t == 'number' then
    if value ~= value or value == math.huge or value == -math.huge then return tostring(value) end
    return value
  end
  if t == 'nil' then return jsonNull() end
  if t ~= 'table' or seen[value] or depth > M.JSON_DEPTH then return t end
  seen[value] = true
  local count, largest, isList = 0, 0, true
  for k in pairs(value) do
    count = count + 1
    if isWhole(k) and k >= 1 then
      if k > largest then largest = k end
    else
      isList = false
    end
  end
  local out = {}
  if isList and largest == count then
    for i = 1, count do out[i] = toJsonValue(value[i], seen, depth + 1) end
    out = jsonList(out)
  else
    for k, v in pairs(value) do out[tostring(k)] = toJsonValue(v, seen, depth + 1) end
  end
  seen[value] = nil
  return out
end

-- A packed list of Lua values (table.pack) as a JSON list, nils as null.
local function jsonValues(packed, first)
  local out = {}
  for i = first, packed.n do out[#out + 1] = toJsonValue(packed[i], {}, 1) end
  return jsonList(out)
end
M.toJsonValue = function(value) return toJsonValue(value, {}, 1) end

-- args of call_peripheral and turtle: a JSON list (may be absent); -> list, n | nil, message
local function argList(value)
  if value == nil then return {}, 0 end
  if type(value) ~= 'table' then return nil, 'args must be a list' end
  local n = 0
  for k in pairs(value) do
    if not isWhole(k) or k < 1 then return nil, 'args must be a list' end
    if k > n then n = k end
  end
  local list = {}
  for i = 1, n do
    if value[i] ~= jsonNull() then list[i] = value[i] end
  end
  return list, n
end

local function peripheralError(message)
  return errorValue('peripheral_error', message)
end

local function peripheralApi(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  if type(session.peripheral) ~= 'table' then
    req.respond(false, nil, peripheralError('this computer has no peripheral API'))
    return
  end
  return session, session.peripheral
end

-- list_peripherals {} -> {peripherals: [{name, types, methods}]}. getType returns every type
-- of a peripheral (CC:Tweaked 1.99+: "monitor", or "inventory" beside "minecraft:chest").
local function handleListPeripherals(req, ctx)
  local _, api = peripheralApi(req, ctx)
  if not api then return end
  local list = {}
  for _, name in ipairs(api.getNames()) do
    local types = table.pack(api.getType(name))
    local typeNames = {}
    for i = 1, types.n do
      if type(types[i]) == 'string' then typeNames[#typeNames + 1] = types[i] end
    end
    local methods = {}
    for _, method in ipairs(api.getMethods(name) or {}) do methods[#methods + 1] = tostring(method) end
    table.sort(methods)
    list[#list + 1] = { name = name, types = jsonList(typeNames), methods = jsonList(methods) }
  end
  req.respond(true, { peripherals = jsonList(list) })
end
-- list_peripherals: {peripherals: [{name, types, methods}]} (§16)
registerRequest('list_peripherals', 'peripheral', handleListPeripherals)

--[[ A call that may yield (CC:Tweaked's turtle actions and main-thread peripheral methods wait
for an event) runs as a job beside the daemon, like exec: it is resumed with the events it
waits for, times out after M.PERIPHERAL_TIMEOUT_MS, and `cancel` ends it. `body` returns
the call's values; `answer(job, packed)` makes the final answer (or nil, error). ]]
local function startCall(session, req, body, answer)
  startJob(session, req, {
    body = body, timeoutMs = M.PERIPHERAL_TIMEOUT_MS, maxOutputBytes = 1024,
    answer = function(job, result)
      if job.stopReason == 'timeout' then
        return nil, errorValue('timeout', ('no answer within %d ms'):format(M.PERIPHERAL_TIMEOUT_MS))
      end
      if not result[1] then return nil, peripheralError(errorText(result[2])) end
      return answer(result)
    end,
  })
end

-- call_peripheral {name, method, args?} -> {returns}; CraftOS's error is peripheral_error.
local function handleCallPeripheral(req, ctx)
  local session, api = peripheralApi(req, ctx)
  if not api then return end
  local payload = req.payload
  local name, method = payload.name, payload.method
  if type(name) ~= 'string' or name == '' then return badRequest(req, 'name must be a non-empty string') end
  if type(method) ~= 'string' or method == '' then return badRequest(req, 'method must be a non-empty string') end
  local args, n = argList(payload.args)
  if not args then return badRequest(req, n) end
  -- CraftOS-PC's peripheral.call on an empty side returns nil: say so instead.
  if not api.isPresent(name) then return req.respond(false, nil, peripheralError('no peripheral named ' .. name)) end
  startCall(session, req, function() return api.call(name, method, table.unpack(args, 1, n)) end,
    function(result) return { returns = jsonValues(result, 2) } end)
end
-- call_peripheral: {returns} as JSON; peripheral_error
registerRequest('call_peripheral', 'peripheral', handleCallPeripheral)

--[[ peripheral_events {events?, timeoutMs?}: each peripheral event (M.PERIPHERAL_EVENTS, or
the names given) as a partial {type: "event", name, args} until cancelled, the connection
ends, or timeoutMs (then the answer is {events: count, timedOut: true}). Counted with the
screen watches (at most M.MAX_WATCHES at once). ]]
M.PERIPHERAL_EVENTS = {
  'peripheral', 'peripheral_detach', 'monitor_touch', 'monitor_resize', 'redstone', 'modem_message',
  'disk', 'disk_eject', 'speaker_audio_empty', 'turtle_inventory',
}

local EventWatch = {}
EventWatch.__index = EventWatch

function EventWatch:stop(reason)
  if self.done then return false end
  self.done = true
  for i = 1, #self.disposers do self.disposers[i]() end
  if self.clearTimeout then self.clearTimeout() end
  local session = self.session
  session.watches[self.req.messageId] = nil
  session.watchCount = session.watchCount - 1
  if reason == 'timeout' then
    self.req.respond(true, { events = self.count, timedOut = true })
  elseif reason == 'cancel' then
    self.req.respond(false, nil, errorValue('cancelled', 'cancelled by the gateway'))
  elseif reason == 'stopped' then
    self.req.respond(false, nil, session:stopReason() or errorValue('stopped', 'stopped on the computer'))
  else
    self.req.respond(false, nil, errorValue('not_connected', 'the connection ended'))
  end
  return true
end

local function handlePeripheralEvents(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local names, err = stringList(req.payload.events, 'events')
  if not names then return badRequest(req, err) end
  if #names == 0 then names = M.PERIPHERAL_EVENTS end
  local timeoutMs
  timeoutMs, err = optionalNumber(req.payload, 'timeoutMs', M.EVENTS_TIMEOUT_MS, 1, M.EVENTS_MAX_TIMEOUT_MS)
  if not timeoutMs then return badRequest(req, err) end
  if session.watches[req.messageId] then return badRequest(req, 'a request with this messageId is running') end
  if session.watchCount >= M.MAX_WATCHES then
    return req.respond(false, nil, errorValue('overloaded', ('%d watches are running already'):format(session.watchCount)))
  end
  local watch = setmetatable({ session = session, req = req, attempt = session.current, count = 0, disposers = {} }, EventWatch)
  session.watches[req.messageId] = watch
  session.watchCount = session.watchCount + 1
  local seenName = {}
  for _, name in ipairs(names) do
    if not seenName[name] then
      seenName[name] = true
      watch.disposers[#watch.disposers + 1] = session.loop.register(name, function(...)
        if watch.done then return end
        watch.count = watch.count + 1
        req.partial({ type = 'event', name = name, args = jsonValues(table.pack(dropEventName(name, ...)), 1) })
      end)
    end
  end
  watch.clearTimeout = session.loop.setTimeout(function()
    watch.clearTimeout = nil
    watch:stop('timeout')
  end, timeoutMs / 1000)
end
-- peripheral_events: partials {type: "event", name, args}
registerRequest('peripheral_events', 'peripheral', handlePeripheralEvents)

-- turtle {action, args?} -> {returns, fuel, selected}. The actions of CC:Tweaked's turtle
-- API an agent may use (SPEC §16); the moves count against sandbox.turtle_budget while an
-- ask of this computer runs (Session:forward starts the count).
M.TURTLE_ACTIONS = {}
for _, action in ipairs({
  'turnLeft', 'turnRight', 'dig', 'digUp', 'digDown', 'place', 'placeUp', 'placeDown',
  'detect', 'detectUp', 'detectDown', 'inspect', 'inspectUp', 'inspectDown', 'compare',
  'compareUp', 'compareDown', 'compareTo', 'attack', 'attackUp', 'attackDown', 'drop', 'dropUp',
  'dropDown', 'suck', 'suckUp', 'suckDown', 'select', 'getSelectedSlot', 'getItemCount',
  'getItemSpace', 'getItemDetail', 'transferTo', 'getFuelLevel', 'getFuelLimit', 'refuel',
  'equipLeft', 'equipRight', 'craft',
}) do M.TURTLE_ACTIONS[action] = 'act' end
for _, action in ipairs({ 'forward', 'back', 'up', 'down' }) do M.TURTLE_ACTIONS[action] = 'move' end

M.NOT_A_TURTLE = 'this computer is not a turtle (no turtle API)'

local function turtleBudget(session)
  local value = session.settings and session.settings.get and session.settings.get('sandbox.turtle_budget')
  if type(value) ~= 'number' or value < 0 then return M.TURTLE_BUDGET end
  return math.floor(value)
end

local function handleTurtle(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local api = session.turtle
  if type(api) ~= 'table' then return req.respond(false, nil, errorValue('unknown_type', M.NOT_A_TURTLE)) end
  local action = req.payload.action
  local kind = type(action) == 'string' and M.TURTLE_ACTIONS[action]
  if not kind then return badRequest(req, ('unknown turtle action %s'):format(tostring(action))) end
  if type(api[action]) ~= 'function' then
    return req.respond(false, nil, peripheralError(('this turtle cannot %s (it needs an upgrade, e.g. a crafting table for craft)'):format(action)))
  end
  local args, n = argList(req.payload.args)
  if not args then return badRequest(req, n) end
  if kind == 'move' and session.asking then
    local budget = turtleBudget(session)
    if session.turtleMoves >= budget then
      return req.respond(false, nil, errorValue('forbidden', ('this ask has moved the turtle %d times, its budget '
        .. '(sandbox.turtle_budget); ask again, or raise it with "set sandbox.turtle_budget N"'):format(budget)))
    end
    session.turtleMoves = session.turtleMoves + 1
  end
  startCall(session, req, function() return api[action](table.unpack(args, 1, n)) end, function(result)
    local fuel = api.getFuelLevel and api.getFuelLevel()
    local selected = api.getSelectedSlot and api.getSelectedSlot()
    return { returns = jsonValues(result, 2), fuel = toJsonValue(fuel, {}, 1), selected = selected }
  end)
end
-- turtle: {returns, fuel, selected}; moves within the budget
registerRequest('turtle', 'turtle', handleTurtle)
]=])

loadModule('requests', [[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/requests: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The request table ===========================================================
-- Owns: the request table, made of the types the handler modules registered (handlers, exec,
-- files, snapshot, console, peripherals: each with registerRequest where it defines its
-- handler), after the last of them ran; no type may be registered after it.
-- Needs: handlers and every module that registers. Exports: M.requestHandlers (type ->
-- handler, what dispatch calls) and M.REQUEST_CAPABILITY (type -> the capability it needs in
-- the setting sandbox.allow; none for ping and cancel).

local M, internal = ...

M.requestHandlers, M.REQUEST_CAPABILITY = {}, {}
for msgType, entry in pairs(internal.closeRequests()) do
  M.requestHandlers[msgType] = entry.handler
  M.REQUEST_CAPABILITY[msgType] = entry.capability
end
]])

loadModule('dispatch', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/dispatch: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Dispatch ====================================================================
-- Owns: turning one frame from the gateway into a handler call or a reply for a waiting
-- program (onMessage), the request object a handler answers through, the frame size limit.
-- Needs: constants, encodings, envelopes, the request table. Exports: M.onMessage.

local M, internal = ...
local defaultDecode = internal.defaultDecode
local defaultEncode = internal.defaultEncode
local errorValue = internal.errorValue
local expect = internal.expect

local function encodeFor(ctx)
  return ctx.encode or defaultEncode
end

local function encodeFrame(ctx, frame)
  local ok, text = pcall(encodeFor(ctx), frame)
  if not ok or type(text) ~= 'string' or text == '' then return nil end
  return text
end

-- Builds the request object handed to a handler; its answers go out through ctx.send.
-- `raw`: the bytes that came after the request's header in a binary message (a file part).
local function newRequest(ctx, messageId, msgType, payload, raw)
  local req = { messageId = messageId, type = msgType, payload = M.coercePayload(payload), answered = false,
    raw = raw }
  local function frameFor(ok, answer, err)
    return M.computerResponse(ctx.traposId, messageId, msgType, ok, answer, err)
  end

  function req.respond(ok, answer, err, shrink)
    if req.answered then return false end
    req.answered = true
    local text = encodeFrame(ctx, frameFor(ok, answer, err))
    while text and #text > M.MAX_SEND and shrink and shrink(answer) do
      text = encodeFrame(ctx, frameFor(ok, answer, err))
    end
    if text and #text > M.MAX_SEND then
      text = encodeFrame(ctx, frameFor(false, nil, errorValue('too_large',
        ('the answer is %d bytes, over the %d-byte frame limit'):format(#text, M.MAX_SEND))))
    end
    if not text then return false end
    return ctx.send(text) and true or false
  end

  -- A file part's answer as one binary message: the frame (answer without `data`), a newline,
  -- then `data` raw (docs/protocol.md, "Binary file parts"). Only where the socket sends
  -- binary messages (ctx.sendBinary).
  if ctx.sendBinary then
    function req.respondBinary(answer, data)
      if req.answered then return false end
      local text = encodeFrame(ctx, frameFor(true, answer))
      if not text or #text + 1 + #data > M.MAX_SEND then
        return req.respond(false, nil, errorValue('too_large', 'the part is over the frame limit'))
      end
      req.answered = true
      return ctx.sendBinary(text .. '\n' .. data) and true or false
    end
  end

  -- An interim answer (SPEC §2 streaming): ok, `partial: true`; the request stays open.
  function req.partial(answer)
    if req.answered then return false end
    local frame = frameFor(true, answer)
    frame.partial = true
    local text = encodeFrame(ctx, frame)
    if not text or #text > M.MAX_SEND then return false end
    return ctx.send(text) and true or false
  end
  return req
end

local function forbiddenMessage(ctx, capability)
  return ('computer %s has not allowed %s: on it, run "sandbox allow %s"'):format(
    tostring(ctx.traposId), capability, capability)
end

local function dispatchRequest(ctx, messageId, msgType, payload, raw)
  local handlers = ctx.handlers or M.requestHandlers
  local handler = handlers[msgType]
  local req = newRequest(ctx, messageId, msgType, payload, raw)
  if type(handler) ~= 'function' then
    req.respond(false, nil, errorValue('unknown_type', 'unknown request type: ' .. msgType))
    return 'unknown_type'
  end
  local capability = M.REQUEST_CAPABILITY[msgType]
  -- Stopped by the player (sandbox stop, or the stop side's redstone): only ping and cancel.
  local stopped = capability and ctx.stopped and ctx.stopped()
  if stopped then
    req.respond(false, nil, stopped)
    return 'stopped'
  end
  if capability and not (ctx.allowed and ctx.allowed(capability)) then
    req.respond(false, nil, errorValue('forbidden', forbiddenMessage(ctx, capability)))
    return 'forbidden'
  end
  local ok, err = pcall(handler, req, ctx)
  if not ok and not req.answered then
    req.respond(false, nil, errorValue('internal', tostring(err)))
  end
  return msgType
end

--[[ onMessage(content, ctx, raw?): handle one text frame from the gateway, or (`raw`) the
header of a binary one: a write_file part whose bytes are `raw`.
ctx = { traposId, send(text) -> ok, sendBinary(message)?, queueEvent(...), decode?, encode?,
        handlers?, onHello(messageId, ok, payload, error)?, onReply(messageId) -> consumed? }
Returns what it did: the request type it dispatched (e.g. 'ping'), 'unknown_type', 'forbidden',
'hello', 'reply' or 'ignored'. Never raises. ]]
function M.onMessage(content, ctx, raw)
  expect(2, ctx, 'table')
  if type(content) ~= 'string' or content == '' then return 'ignored' end
  local decode = ctx.decode or defaultDecode
  local okDecode, frame = pcall(decode, content)
  if not okDecode or type(frame) ~= 'table' then return 'ignored' end
  local event, messageId, msgType = frame.event, frame.messageId, frame.type
  if type(messageId) ~= 'string' or messageId == '' or type(msgType) ~= 'string' or msgType == '' then
    return 'ignored'
  end

  if event == 'gateway_request' then
    return dispatchRequest(ctx, messageId, msgType, frame.payload, raw)
  elseif raw then
    return 'ignored' -- the gateway sends only file parts' requests as binary messages

  elseif event == 'gateway_response' then
    local ok = frame.ok == true
    local payload, err
    if ok then payload = M.coercePayload(frame.payload) else err = M.coerceError(frame.error) end
    if msgType == 'hello' then
      if ctx.onHello then ctx.onHello(messageId, ok, payload, err) end
      return 'hello'
    end
    -- A partial answer to a program's streaming request: the request stays pending.
    if frame.partial == true then
      if ok then ctx.queueEvent(M.EVENT_PARTIAL, messageId, payload) end
      return 'partial'
    end
    -- An answer to the daemon's own request is consumed; others go to the program waiting.
    if ctx.onReply and ctx.onReply(messageId, ok, payload, err) == true then return 'reply' end
    ctx.queueEvent(M.EVENT_REPLY, messageId, ok, payload, err)
    return 'reply'
  end
  return 'ignored'
end

internal.encodeFrame = encodeFrame
]=])

loadModule('session', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/session: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The session (the daemon) ====================================================
-- Owns: the one WebSocket to the gateway: connect, hello, reconnect with backoff, forwarding
-- programs' requests, announcing capabilities, the published state; startSession.
-- Needs: everything above (dispatch for frames, jobs to stop them). Exports: M.startSession.

local M, internal = ...
local defaultDecode = internal.defaultDecode
local defaultEncode = internal.defaultEncode
local dropEventName = internal.dropEventName
local encodeFrame = internal.encodeFrame
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty
local field = internal.field
local jsonList = internal.jsonList
local stopJobs = internal.stopJobs
local stopWatches = internal.stopWatches

--[[ A session moves through these states (`session.state()`):
  connecting   websocketAsync called, waiting for websocket_success (connectTimeout)
  handshaking  hello sent, waiting for its answer (helloTimeout)
  ready        hello answered ok: program requests are forwarded, gateway requests answered
  waiting      the attempt failed; a reconnect is scheduled (backoff)
  stopped      for good: unauthorized, replaced, or stop() was called
Every recoverable failure goes through one transition, `fail(err)`: record the error, end the
attempt (timers cleared, handle closed once, pending sends failed) and schedule a reconnect.
`stopForGood(err)` is the terminal one. Gateway requests go to M.requestHandlers through
onMessage; the connection code knows nothing about them. ]]
local Session = {}
Session.__index = Session

function Session:publish()
  local published = self.published
  if not published then return end
  published.running = not self.stopped
  published.state = self.state
  published.connected = self.state == 'ready'
  published.traposId = self.traposId
  published.url = self.baseUrl
  published.lastError = self.lastError
  published.accountId = self.accountId
  published.version = _VERSION
  published.capabilities = self:capabilities()
  local stopped = self:stopReason()
  published.agentStopped = stopped ~= nil
  published.stopMessage = stopped and stopped.message or nil
  published.updated = self.os.epoch and self.os.epoch('utc') or nil
end

function Session:queue(...)
  local ok, err = pcall(self.os.queueEvent, ...)
  if not ok then self.log('queueEvent failed: ' .. tostring(err)) end
end

function Session:reply(messageId, err)
  self:queue(M.EVENT_REPLY, messageId, false, nil, err)
end

function Session:closeHandle(handle)
  if handle == nil or self.closedHandles[handle] then return end
  self.closedHandles[handle] = true
  local ok, err = pcall(handle.close)
  if not ok then self.log('close failed: ' .. tostring(err)) end
end

function Session:sendOn(handle, text, binary)
  if handle == nil or self.closedHandles[handle] then return false, 'connection closed' end
  if type(text) ~= 'string' or text == '' then return false, 'refusing to send an empty message' end
  local ok, err = pcall(handle.send, text, binary)
  if not ok then return false, tostring(err) end
  return true
end

function Session:failInFlight(message)
  local ids = self.inFlight
  self.inFlight, self.inFlightCount, self.asking = {}, 0, nil
  for id in pairs(ids) do
    self:reply(id, errorValue('not_connected', message))
  end
end

local function clearAttemptTimers(attempt)
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
end

-- Ends the current attempt: timers cleared, handle closed once, pending sends failed.
function Session:endAttempt(message)
  local attempt = self.current
  if not attempt or attempt.done then return end
  attempt.done = true
  clearAttemptTimers(attempt)
  self:closeHandle(attempt.handle)
  self:failInFlight(message or 'connection lost')
  -- Their answers could only go on this connection: programs and watches it started are stopped.
  stopJobs(self, attempt)
  stopWatches(self, attempt)
end

function Session:clearReconnect()
  if self.cancelReconnect then self.cancelReconnect(); self.cancelReconnect = nil end
end

function Session:scheduleReconnect()
  if self.terminal or self.stopped then return end
  self.failures = self.failures + 1
  local base = self.backoffMin
  for _ = 2, self.failures do
    base = base * 2
    if base >= self.backoffMax then base = self.backoffMax; break end
  end
  if base > self.backoffMax then base = self.backoffMax end
  local delay = base * (1 - self.backoffJitter * self.random())
  self.state = 'waiting'
  self:publish()
  self.log(('reconnecting in %.1f s'):format(delay))
  self:clearReconnect()
  self.cancelReconnect = self.loop.setTimeout(function()
    self.cancelReconnect = nil
    self:connect()
  end, delay)
end

-- The one transition for every recoverable failure.
function Session:fail(err)
  self.lastError = err
  self:endAttempt(err.message)
  self:scheduleReconnect()
end

function Session:stopForGood(err)
  self.terminal = true
  self.lastError = err
  self:endAttempt(err.code .. ': ' .. (err.message or ''))
  self:clearReconnect()
  self.state = 'stopped'
  self:publish()
  self.log('stopped: ' .. err.code .. ' ' .. (err.message or ''))
end

function Session:isCurrent(url)
  local attempt = self.current
  return attempt ~= nil and not attempt.done and url == attempt.url
end

-- Arms a timer that fails the attempt if it is still in `state` when it fires.
function Session:deadline(attempt, state, seconds, makeError)
  return self.loop.setTimeout(function()
    if self.current == attempt and not attempt.done and self.state == state then
      self:fail(makeError())
    end
  end, seconds)
end

-- connecting ----------------------------------------------------------------------

function Session:connect()
  if self.terminal or self.stopped then return end
  self.attempts = self.attempts + 1
  local attempt = { url = M.withNonce(self.baseUrl, ('%s-%d'):format(self.tag, self.attempts)) }
  self.current = attempt
  self.state = 'connecting'
  self:publish()
  attempt.clearConnect = self:deadline(attempt, 'connecting', self.connectTimeout, function()
    return errorValue('not_connected', 'connection attempt timed out')
  end)
  local ok, result, err = pcall(self.http.websocketAsync, attempt.url, self.headers)
  if not ok or result == false then
    -- CC:Tweaked may also queue websocket_failure for this URL; the attempt is done by then.
    self:fail(errorValue('not_connected', tostring(ok and (err or 'websocket refused') or result)))
  end
end

-- Whether `url` is one of this session's attempts: their nonces start with its tag.
-- Websocket events reach every program and tab; only these are the daemon's business.
function Session:owns(url)
  return type(url) == 'string' and url:find('n=' .. self.tag .. '-', 1, true) ~= nil
end

-- connecting -> handshaking: the socket is open, send hello. Only a handle this session asked
-- for is touched: another program's (another tab's, another daemon's) is none of its business.
function Session:onOpen(url, handle)
  if not self:owns(url) then return end
  local attempt = self.current
  if not self:isCurrent(url) or attempt.handle then
    -- A late success for an attempt this session abandoned: nobody will use it, free the slot.
    if type(handle) == 'table' and handle ~= attempt.handle then self:closeHandle(handle) end
    return
  end
  attempt.handle = handle
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
  self.state = 'handshaking'
  self:publish()
  attempt.helloId = M.newMessageId(self.os)
  local capabilities = self:capabilities()
  self.announced = table.concat(capabilities, ',')
  local stopped = self:stopReason()
  self.announcedStop = stopped and stopped.message or ''
  local okEncode, text = pcall(self.encode,
    M.hello(self.traposId, attempt.helloId, self.secret, _VERSION, capabilities, stopped))
  local sent, sendErr = false, text
  if okEncode then sent, sendErr = self:sendOn(handle, text) end
  if not sent then
    self:fail(errorValue('not_connected', 'could not send hello: ' .. tostring(sendErr)))
    return
  end
  attempt.clearHello = self:deadline(attempt, 'handshaking', self.helloTimeout, function()
    return errorValue('timeout', ('no hello answer within %d s'):format(self.helloTimeout))
  end)
end

-- handshaking -> ready, stopped (unauthorized) or waiting.
function Session:onHello(messageId, ok, payload, err)
  local attempt = self.current
  if self.state ~= 'handshaking' or not attempt or attempt.done or messageId ~= attempt.helloId then return end
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if ok then
    self.state = 'ready'
    self.failures = 0
    self.lastError = nil
    self.accountId = payload and payload.accountId or nil
    self:publish()
    self.log('connected as ' .. self.traposId)
    self:queue(M.EVENT_CONNECTED, self.traposId)
    self:announceCapabilities() -- in case they changed since hello was sent
    self:announceStop(self:stopReason())
  elseif err and err.code == 'unauthorized' then
    self:stopForGood(err)
  else
    self:fail(err or errorValue('internal', 'hello failed'))
  end
end

-- Any state: the socket failed or closed.
function Session:onFailure(url, err)
  if not self:isCurrent(url) then return end
  local message = 'connection failed: ' .. tostring(err or 'unknown error')
  if type(err) == 'string' and err:find('not permitted', 1, true) then message = M.notPermitted(self.baseUrl, err) end
  self:fail(errorValue('not_connected', message))
end

--[[ CC:Tweaked's http.rules deny the gateway's host ("Domain not permitted"): by default every
private and local address is, so a gateway on the server's own machine or its LAN needs an
allow rule in front of the $private one. Only the server admin can add it: say exactly what. ]]
function M.notPermitted(url, err)
  local host = url:match('^%a+://%[([^%]]+)%]') or url:match('^%a+://([^/:?]+)') or url
  return ('%s: the Minecraft server does not let computers reach %s. The server admin must add, '
    .. 'before the $private rule in serverconfig/computercraft-server.toml: '
    .. '[[http.rules]] host = "%s" action = "allow"'):format(tostring(err), host, host)
end

function Session:onClosed(url, reason, code)
  if not self:isCurrent(url) then return end
  local attempt = self.current
  -- The socket is gone: make sure we never call close() on it afterwards.
  if attempt.handle then self.closedHandles[attempt.handle] = true end
  local detail = (type(reason) == 'string' and reason ~= '') and reason or nil
  if code == M.CLOSE_REPLACED then
    self:stopForGood(errorValue('replaced', detail or 'replaced by a newer connection with the same traposId'))
    return
  end
  if code == M.CLOSE_UNAUTHORIZED then
    self:stopForGood(errorValue('unauthorized', detail or 'the gateway rejected the password'))
    return
  end
  local message = 'connection closed'
  if code then message = message .. ' (' .. tostring(code) .. (detail and (' ' .. detail) or '') .. ')' end
  self:fail(errorValue('not_connected', message))
end

-- handshaking and ready: a frame from the gateway.
function Session:onFrame(url, content, isBinary)
  local attempt = self.current
  if not self:isCurrent(url) or not attempt.handle then return end
  local raw
  if isBinary then
    -- A file part (docs/protocol.md): its request as JSON, a newline, its bytes.
    if not M.binaryParts() or type(content) ~= 'string' then return end
    local newline = content:find('\n', 1, true)
    if not newline then return end
    content, raw = content:sub(1, newline - 1), content:sub(newline + 1)
  end
  if not attempt.ctx then
    local handle = attempt.handle
    attempt.ctx = {
      traposId = self.traposId,
      session = self,
      encode = self.encode,
      decode = self.decode,
      send = function(text) return self:sendOn(handle, text) end,
      sendBinary = M.binaryParts() and function(message) return self:sendOn(handle, message, true) end or nil,
      queueEvent = function(...) self:queue(...) end,
      onHello = function(...) self:onHello(...) end,
      onReply = function(messageId, ok, _, err) return self:onReply(messageId, ok, err) end,
      allowed = function(capability) return self:allows(capability) end,
      stopped = function() return self:stopReason() end,
    }
  end
  M.onMessage(content, attempt.ctx, raw)
end

-- Returns true for the answer to one of the daemon's own requests (nobody waits for it).
function Session:onReply(messageId, ok, err)
  if self.ownRequests[messageId] then
    self.ownRequests[messageId] = nil
    if not ok then self.log('gateway refused ' .. messageId .. ': ' .. tostring(err and err.message)) end
    return true
  end
  if self.inFlight[messageId] then
    self.inFlight[messageId] = nil
    self.inFlightCount = self.inFlightCount - 1
  end
  if self.asking == messageId then self.asking = nil end
end

-- Capabilities: the live setting is what counts; the gateway hears of every change. ----

function Session:capabilities()
  local value = nil
  if self.settings and self.settings.get then value = self.settings.get('sandbox.allow') end
  return M.parseCapabilities(value)
end

function Session:allows(capability)
  local list = self:capabilities()
  self:announceCapabilities(list)
  for _, name in ipairs(list) do
    if name == capability then return true end
  end
  return false
end

-- Sends a computer_request of the client's own (its answer is only logged); whether it went.
local function sendOwn(self, msgType, payload, what)
  local messageId = M.newMessageId(self.os)
  local text = encodeFrame(self, M.computerRequest(self.traposId, messageId, msgType, payload))
  local sent, err = self:sendOn(self.current.handle, text)
  if not sent then
    self.log('could not announce ' .. what .. ': ' .. tostring(err))
    return false
  end
  self.ownRequests[messageId] = true
  return true
end

-- Sends computer_request `capabilities` when the allowed list differs from the one last
-- announced (in hello or here). Called on trapos_sandbox_capabilities and before each check.
function Session:announceCapabilities(list)
  if type(list) ~= 'table' then list = self:capabilities() end
  local key = table.concat(list, ',')
  if self.published then self.published.capabilities = list end
  if self.state ~= 'ready' or key == self.announced then return false end
  if not sendOwn(self, 'capabilities', { capabilities = jsonList(list) }, 'capabilities') then
    return false
  end
  self.announced = key
  self.log('capabilities: ' .. (key == '' and 'none' or key))
  return true
end

-- Stop (SPEC §16): the player's brake, read live like the capabilities. ------------------

-- Why the agent is stopped here ({code = 'stopped', message} saying how to resume), or nil.
function Session:stopReason()
  local settingsApi = self.settings
  if settingsApi and settingsApi.get and settingsApi.get('sandbox.stopped') == true then
    return errorValue('stopped', ('the player stopped the sandbox agent on computer %s; on it, run "sandbox resume"')
      :format(self.traposId))
  end
  local side = settingsApi and settingsApi.get and settingsApi.get('sandbox.stop_side')
  local redstoneApi = self.redstone
  if type(side) == 'string' and side ~= '' and redstoneApi and redstoneApi.getInput then
    local ok, on = pcall(redstoneApi.getInput, side)
    if ok and on then
      return errorValue('stopped', ('a redstone signal on the %s side of computer %s stops the sandbox agent: '
        .. 'turn it off to resume'):format(side, self.traposId))
    end
  end
end

-- On sandbox stop / resume and on every redstone change: once stopped, every running request
-- (programs, Lua, watches, peripheral calls) ends with `stopped`; new ones are refused (dispatch).
-- The gateway is told (announceStop): it ends the running ask and shows the computer stopped.
function Session:onStopChange()
  local reason = self:stopReason()
  local stopped = reason ~= nil
  if stopped and not self.halted then
    stopJobs(self, nil, 'stopped')
    stopWatches(self, nil, 'stopped')
  end
  self.halted = stopped
  self:publish()
  self:announceStop(reason)
end

-- Sends computer_request `stopped {stopped, stopMessage?}` when the stop state differs from the
-- one last announced (in hello or here), like announceCapabilities. A gateway older than this
-- request answers unknown_type, which is only logged. `stopped`: stopReason()'s answer.
function Session:announceStop(stopped)
  local key = stopped and stopped.message or ''
  if self.state ~= 'ready' or key == self.announcedStop then return false end
  local payload = { stopped = stopped ~= nil, stopMessage = stopped and stopped.message or nil }
  if not sendOwn(self, 'stopped', payload, 'the stop') then return false end
  self.announcedStop = key
  self.log(stopped and 'agent stopped: the gateway is told' or 'agent resumed: the gateway is told')
  return true
end

-- ready: a program asks to send a request (trapos_sandbox_send); anything else answers at once.
function Session:forward(messageId, msgType, payload)
  if type(messageId) ~= 'string' or messageId == '' then return end
  if type(msgType) ~= 'string' or msgType == '' then
    self:reply(messageId, errorValue('bad_request', 'type must be a non-empty string'))
    return
  end
  if self.state ~= 'ready' then
    local err = self.lastError
    if not (self.terminal and err) then
      err = errorValue('not_connected', 'not connected to the sandbox gateway' ..
        (err and (' (' .. tostring(err.message) .. ')') or ''))
    end
    self:reply(messageId, err)
    return
  end
  local okEncode, text = pcall(self.encode, M.computerRequest(self.traposId, messageId, msgType, M.coercePayload(payload)))
  if not okEncode or type(text) ~= 'string' or text == '' then
    self:reply(messageId, errorValue('bad_request', 'cannot encode: ' .. tostring(text)))
    return
  end
  if #text > M.MAX_SEND then
    self:reply(messageId, errorValue('too_large', ('message of %d bytes'):format(#text)))
    return
  end
  local sent, err = self:sendOn(self.current.handle, text)
  if not sent then
    self:reply(messageId, errorValue('not_connected', 'send failed: ' .. tostring(err)))
    self:fail(errorValue('not_connected', 'send failed: ' .. tostring(err)))
    return
  end
  -- The map only makes a drop answer pending requests; past the cap, forget the oldest batch.
  if self.inFlightCount >= M.MAX_IN_FLIGHT then self.inFlight, self.inFlightCount = {}, 0 end
  self.inFlight[messageId] = true
  self.inFlightCount = self.inFlightCount + 1
  if msgType == 'ask' then self.asking, self.turtleMoves = messageId, 0 end
end

-- stopped, by the owner.
function Session:stop()
  if self.stopped then return end
  self.stopped = true
  self:endAttempt('daemon stopped')
  stopJobs(self)
  stopWatches(self)
  self:clearReconnect()
  for i = 1, #self.disposers do self.disposers[i]() end
  self.disposers = {}
  self.state = 'stopped'
  self:publish()
end

-- Which OS event calls which method.
local SESSION_EVENTS = {
  websocket_success = 'onOpen',
  websocket_failure = 'onFailure',
  websocket_closed = 'onClosed',
  websocket_message = 'onFrame',
  [M.EVENT_SEND] = 'forward',
  [M.EVENT_CAPABILITIES] = 'announceCapabilities',
  [M.EVENT_STOP] = 'onStopChange',
  redstone = 'onStopChange',
}

function Session:listen()
  for name, method in pairs(SESSION_EVENTS) do
    self.disposers[#self.disposers + 1] = self.loop.register(name, function(...)
      local ok, err = pcall(self[method], self, dropEventName(name, ...))
      if not ok then self.log(name .. ' handler failed: ' .. tostring(err)) end
    end)
  end
end

--[[ startSession(opts): the daemon. opts:
  url         gateway WebSocket URL (required), e.g. ws://host:4444/gateway
  secret      the shared password sent in hello (optional)
  http        table with websocketAsync(url, headers)     default _G.http
  eventLoop   register/setTimeout loop                     default _G.bootEventLoop or own loop
  encode, decode                                           default textutils JSON
  os          getComputerID/getComputerLabel/epoch/queueEvent  default _G.os
  random      function() -> [0,1)                          default math.random
  state       table to publish state into                  default _G.traposSandboxState
  log         function(message)                            default: none
  helloTimeout, connectTimeout, backoffMin, backoffMax, backoffJitter (seconds / fraction)
For the sandbox requests (SPEC §9), the CraftOS APIs they use (default: the globals):
  fs, term, settings (sandbox.allow), textutils (serialize, for eval),
  peripheral, turtle (SPEC §16; no turtle API: turtle requests answer unknown_type),
  redstone (the stop side's signal)
  shell       the shell exec runs programs with (the daemon's own; none: a plain loader)
  multishell  the multishell API eval code sees (the daemon's own; not a global on CC:Tweaked)
  clock       function() -> milliseconds              default os.epoch('utc')
  screen      function() -> the terminal exec and eval draw on   default _G.traposSandboxScreen
                (the shell's), else the daemon's own
  recorder    the readable screen (M.newRecorder), or false   default M.installRecorder(term)
Returns a session: isReady(), lastError(), state(), status(), stop(), loop (the event loop used). ]]
function M.startSession(opts)
  expect(1, opts, 'table')
  local baseUrl = expectNonEmpty(1, opts.url)
  field(opts, 'secret', 'string', 'nil')
  local httpApi = opts.http or http
  if type(httpApi) ~= 'table' or type(httpApi.websocketAsync) ~= 'function' then
    error('bad argument #1 (opts.http with websocketAsync expected)', 2)
  end
  local osLike = opts.os or os
  local published = opts.state
  if published == nil then
    published = rawget(_G, 'traposSandboxState') or {}
    rawset(_G, 'traposSandboxState', published)
  end

  local self = setmetatable({
    baseUrl = baseUrl,
    secret = opts.secret,
    headers = opts.headers,
    http = httpApi,
    os = osLike,
    loop = opts.eventLoop or rawget(_G, 'bootEventLoop') or M.createEventLoop(osLike),
    encode = opts.encode or defaultEncode,
    decode = opts.decode or defaultDecode,
    random = opts.random or math.random,
    log = opts.log or function() end,
    helloTimeout = opts.helloTimeout or M.HELLO_TIMEOUT,
    connectTimeout = opts.connectTimeout or M.CONNECT_TIMEOUT,
    backoffMin = opts.backoffMin or M.BACKOFF_MIN,
    backoffMax = opts.backoffMax or M.BACKOFF_MAX,
    backoffJitter = opts.backoffJitter or M.BACKOFF_JITTER,
    published = published,
    traposId = M.traposId(osLike),
    -- Starts every attempt's nonce: which websocket events are this session's (`owns`).
    tag = ('%.0f-%d'):format(osLike.epoch and osLike.epoch('utc') or 0,
      math.floor((opts.random or math.random)() * 1000000)),
    state = 'connecting',
    terminal = false,
    stopped = false,
    attempts = 0,
    failures = 0,
    current = nil, -- the attempt: { url, handle, done, helloId, ctx, clearHello, clearConnect }
    closedHandles = setmetatable({}, { __mode = 'k' }),
    inFlight = {},
    inFlightCount = 0,
    disposers = {},
    ownRequests = {},
    announced = nil,
    jobs = {},
    jobCount = 0,
    watches = {},
    watchCount = 0,
    fs = opts.fs or rawget(_G, 'fs'),
    term = opts.term or rawget(_G, 'term'),
    settings = opts.settings or rawget(_G, 'settings'),
    textutils = opts.textutils or rawget(_G, 'textutils'),
    peripheral = opts.peripheral or rawget(_G, 'peripheral'),
    turtle = opts.turtle or rawget(_G, 'turtle'),
    redstone = opts.redstone or rawget(_G, 'redstone'),
    halted = false,  -- the agent stopped (sandbox stop or the stop side's redstone), as last seen
    asking = nil,    -- the messageId of this computer's running ask (the turtle budget counts)
    turtleMoves = 0,
    shell = opts.shell,
    -- Like shell, not a global on CC:Tweaked: each program gets it in its environment.
    multishell = opts.multishell or rawget(_G, 'multishell'),
    clock = opts.clock or function() return osLike.epoch('utc') end,
    screen = opts.screen or function() return rawget(_G, 'traposSandboxScreen') end,
  }, Session)
  -- The screen, readable however the daemon was started (sandbox/screen).
  if opts.recorder ~= nil then
    self.recorder = opts.recorder or nil
  else
    self.recorder = M.installRecorder(self.term)
  end
  self:listen()
  self.halted = self:stopReason() ~= nil

  local session = { loop = self.loop, traposId = self.traposId }
  function session.isReady() return self.state == 'ready' end
  function session.lastError() return self.lastError end
  function session.state() return self.state end
  function session.currentUrl() return self.current and self.current.url or nil end
  function session.status()
    return {
      state = self.state, connected = self.state == 'ready', running = not self.stopped,
      traposId = self.traposId, url = baseUrl, lastError = self.lastError, accountId = self.accountId,
      version = _VERSION, attempts = self.attempts, capabilities = self:capabilities(),
      jobs = self.jobCount, watches = self.watchCount, agentStopped = self:stopReason() ~= nil,
    }
  end
  function session.stop() self:stop() end

  self:connect()
  return session
end
]=])

loadModule('api', [=[
local _VERSION = '0.1.0'

-- libsandbox's module sandbox/api: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Entry points for programs ===================================================
-- Owns: what the sandbox command and other programs call: request (one request through the
-- daemon), ask (sandbox ask, streamed), newWrapper (word wrap for ask's output).
-- Needs: constants, encodings, envelopes. Exports: M.request, M.ask, M.newWrapper.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty

--[[ request(type, payload, opts) -> ok, payloadOrError
Queues trapos_sandbox_send and waits for the matching trapos_sandbox_reply or a timer.
opts: timeout (s, default 10), queueEvent, pullEvent, startTimer, cancelTimer, os. ]]
function M.request(msgType, payload, opts)
  expectNonEmpty(1, msgType)
  expect(2, payload, 'table', 'nil')
  expect(3, opts, 'table', 'nil')
  opts = opts or {}
  local osLike = opts.os or os
  local queueEvent = opts.queueEvent or osLike.queueEvent
  local pullEvent = opts.pullEvent or osLike.pullEvent
  local startTimer = opts.startTimer or osLike.startTimer
  local cancelTimer = opts.cancelTimer or osLike.cancelTimer
  local timeout = opts.timeout or M.REQUEST_TIMEOUT

  local messageId = M.newMessageId(osLike)
  local timer = startTimer(timeout)
  queueEvent(M.EVENT_SEND, messageId, msgType, M.coercePayload(payload))
  while true do
    local event, a, b, c, d = pullEvent()
    if event == M.EVENT_REPLY and a == messageId then
      if cancelTimer then pcall(cancelTimer, timer) end
      if b == true then return true, M.coercePayload(c) end
      return false, M.coerceError(d)
    elseif event == 'timer' and a == timer then
      return false, errorValue('timeout', ('no reply from the sandbox daemon within %s s'):format(tostring(timeout)))
    end
  end
end

--[[ newWrapper(width, write, newline, column) -> wrapper
Word-wraps streamed text to `width` columns: `write(s)` puts text on the current line (never
past the width), `newline()` starts the next one; `column` is where the cursor starts (0-based).
  wrapper.text(s)  add text; a word split across two calls is kept until it is complete
  wrapper.flush()  print a kept word
  wrapper.line(s)  s on a line of its own ]]
function M.newWrapper(width, write, newline, column)
  local w = { col = column or 0, pending = '', space = false }
  if width < 1 then width = 1 end
  local function nl() newline(); w.col = 0; w.space = false end
  local function put(word)
    if w.space then
      -- A space is written only in front of the word that follows it on the same line.
      w.space = false
      if w.col + 1 + #word <= width then write(' '); w.col = w.col + 1 else nl() end
    end
    while #word > 0 do
      if w.col > 0 and w.col + #word > width then nl() end
      if #word <= width - w.col then
        write(word); w.col = w.col + #word
        return
      end
      local room = width - w.col
      write(word:sub(1, room)); word = word:sub(room + 1); nl()
    end
  end
  function w.text(s)
    s = w.pending .. tostring(s)
    w.pending = ''
    local i, n = 1, #s
    while i <= n do
      local c = s:sub(i, i)
      if c == '\n' then
        nl(); i = i + 1
      elseif c == ' ' or c == '\t' or c == '\r' then
        if w.col > 0 then w.space = true end
        i = i + 1
      else
        local j = s:find('[ \t\r\n]', i)
        if not j then w.pending = s:sub(i); break end
        put(s:sub(i, j - 1)); i = j
      end
    end
    if #w.pending >= width then put(w.pending); w.pending = '' end
  end
  function w.flush()
    if w.pending ~= '' then put(w.pending); w.pending = '' end
  end
  function w.line(s)
    w.flush()
    if w.col > 0 then nl() end
    w.text(s); w.flush(); nl()
  end
  return w
end

local function shortTool(name)
  name = tostring(name or '?')
  return (name:gsub('^trapsandbox_', ''))
end

--[[ The agent's question (its question tool; partial {type = 'question', id, questions}):
each question with its options numbered. The player types a number (several, comma-separated,
when `multiple`), or an answer of their own when `custom`, then Enter; an empty line rejects
the question. newQuestion(p, line, echo) shows the first; its :key(event, a) takes the `char`,
`paste` and `key` events and returns, once every question has its answer, the ask_answer payload. ]]
local function newQuestion(p, line, echo)
  local q = { id = p.id, questions = p.questions, index = 1, answers = {}, typed = '' }
  function q.show()
    local it = q.questions[q.index]
    line('? ' .. tostring(it.question))
    for i, option in ipairs(type(it.options) == 'table' and it.options or {}) do
      local about = option.description and option.description ~= '' and (' - ' .. tostring(option.description)) or ''
      line(('  %d. %s%s'):format(i, tostring(option.label), about))
    end
    line(it.multiple and 'Numbers, comma-separated' .. (it.custom and ', or your answer' or '') .. ' (empty: refuse):'
      or 'A number' .. (it.custom and ' or your answer' or '') .. ' (empty: refuse):')
  end
  local function picked(it, text)
    local options, labels = type(it.options) == 'table' and it.options or {}, {}
    for word in (text .. ','):gmatch('([^,]*),') do
      local n = tonumber((word:gsub('^%s+', ''):gsub('%s+$', '')))
      if not n or not options[n] then return nil end
      labels[#labels + 1] = tostring(options[n].label)
    end
    if #labels > 1 and not it.multiple then return nil end
    return labels
  end
  function q:key(event, a)
    if event == 'char' or event == 'paste' then
      self.typed = self.typed .. tostring(a)
      echo(a)
      return nil
    end
    local k = keys or {}
    if event ~= 'key' or (a ~= k.enter and a ~= k.numPadEnter) then
      if event == 'key' and a == k.backspace and #self.typed > 0 then
        self.typed = self.typed:sub(1, -2)
        echo(nil)
      end
      return nil
    end
    local text = self.typed
    self.typed = ''
    line('')
    if text:match('^%s*$') then return { questionId = self.id, reject = true } end
    local it = self.questions[self.index]
    local answer = picked(it, text) or (it.custom and { text }) or nil
    if not answer then
      line(('Type a number from 1 to %d.'):format(#(it.options or {})))
      return nil
    end
    self.answers[self.index] = answer
    self.index = self.index + 1
    if self.questions[self.index] then self.show() return nil end
    return { questionId = self.id, answers = self.answers }
  end
  q.show()
  return q
end

-- What a waiting ask shows: how many asks are ahead of it in the gateway's queue.
local function waitingLine(ahead)
  if ahead < 1 then return 'waiting for the agent: next in line' end
  return ('waiting for the agent: %d ask%s ahead'):format(ahead, ahead == 1 and '' or 's')
end

--[[ ask(prompt, opts) -> ok, payloadOrError
`sandbox ask`: sends computer_request ask {prompt, new?, yes?} through the daemon and prints
its partials as they arrive: text word-wrapped through opts.out (a newWrapper), one line per
tool the agent uses, a line while it waits its turn (and again when its place changes), a y/a/n question per permission request (answered with ask_permission),
the agent's questions with numbered options (newQuestion, answered with ask_answer).
`terminate` (Ctrl+T) sends cancel {messageId} and waits for the final answer a while; a second
one gives up at once. Every partial restarts the idle timer, so a long answer never times out.
opts: new, yes, out, print, pullEvent (raw: it must return terminate), queueEvent, startTimer,
cancelTimer, os, timeout. ]]
function M.ask(prompt, opts)
  expectNonEmpty(1, prompt)
  opts = opts or {}
  local osLike = opts.os or os
  local queueEvent = opts.queueEvent or osLike.queueEvent
  local pullEvent = opts.pullEvent or osLike.pullEventRaw
  local startTimer = opts.startTimer or osLike.startTimer
  local cancelTimer = opts.cancelTimer or osLike.cancelTimer
  local say = opts.print or print
  local out = opts.out
  local timeout = opts.timeout or M.ASK_IDLE_TIMEOUT

  local messageId = M.newMessageId(osLike)
  local timer = startTimer(timeout)
  local function restart(seconds)
    if cancelTimer then pcall(cancelTimer, timer) end
    timer = startTimer(seconds)
  end
  local function line(text)
    if out then out.line(text) else say(text) end
  end
  queueEvent(M.EVENT_SEND, messageId, 'ask', { prompt = prompt, new = opts.new == true, yes = opts.yes == true })
  local asking, cancelled, printed, question, waited = nil, false, false, nil, nil
  local function echo(typed)
    if typed then
      write(typed) -- as typed, not through the word-wrapper, which holds back a word's start
    elseif term and term.getCursorPos then -- backspace: one column back, blanked
      local x, y = term.getCursorPos()
      if x > 1 then term.setCursorPos(x - 1, y) term.write(' ') term.setCursorPos(x - 1, y) end
    end
  end
  while true do
    local event, a, b, c, d = pullEvent()
    if event == M.EVENT_PARTIAL and a == messageId then
      if not cancelled then restart(timeout) end
      local p = type(b) == 'table' and b or {}
      if p.type == 'text_delta' and type(p.text) == 'string' then
        printed = true
        if out then out.text(p.text) else write(p.text) end
      elseif p.type == 'tool' then
        if p.status == 'running' then
          line('[' .. shortTool(p.name) .. ']')
        elseif p.status == 'error' then
          line('[' .. shortTool(p.name) .. ' failed' .. (p.error and (': ' .. tostring(p.error)) or '') .. ']')
        end
      elseif p.type == 'permission' and type(p.id) == 'string' then
        line('Allow ' .. shortTool(p.tool) .. ': ' .. tostring(p.detail or '') .. '?')
        line('[y] once  [a] always  [n] no')
        asking = p.id
      elseif p.type == 'waiting' and type(p.ahead) == 'number' then
        -- Its turn has not come (the gateway's queue); told again unchanged now and then.
        if p.ahead ~= waited then
          waited = p.ahead
          line(waitingLine(p.ahead))
        end
      elseif p.type == 'question' and type(p.id) == 'string' and type(p.questions) == 'table'
          and p.questions[1] then
        if out then out.flush() end
        question = newQuestion(p, line, echo)
      end
    elseif event == M.EVENT_REPLY and a == messageId then
      if cancelTimer then pcall(cancelTimer, timer) end
      if b ~= true then
        if out then out.flush() end
        return false, M.coerceError(d)
      end
      local answer = M.coercePayload(c)
      -- Nothing streamed (events lost on the way): the final answer has the whole text.
      if not printed and type(answer.text) == 'string' and answer.text ~= '' then
        if out then out.text(answer.text) else write(answer.text) end
      end
      if out then out.flush() end
      return true, answer
    elseif event == 'char' and asking then
      local response = ({ y = 'once', a = 'always', n = 'reject' })[string.lower(tostring(a))]
      if response then
        queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'ask_permission',
          { permissionId = asking, response = response })
        line(response == 'reject' and '> refused' or ('> allowed (' .. response .. ')'))
        asking = nil
      end
    elseif (event == 'char' or event == 'paste' or event == 'key') and question then
      local answered = question:key(event, a)
      if answered then
        queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'ask_answer', answered)
        line(answered.reject and '> refused' or '> answered')
        question = nil
      end
    elseif event == 'terminate' then
      if cancelled then
        if out then out.flush() end
        return false, errorValue('cancelled', 'stopped waiting for the agent')
      end
      cancelled, asking, question = true, nil, nil
      queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'cancel', { messageId = messageId })
      line('Cancelling the agent...')
      restart(M.ASK_CANCEL_WAIT)
    elseif event == 'timer' and a == timer then
      if out then out.flush() end
      if cancelled then return false, errorValue('cancelled', 'the agent was cancelled') end
      return false, errorValue('timeout', ('no word from the agent for %s s'):format(tostring(timeout)))
    end
  end
end
]=])

return M
