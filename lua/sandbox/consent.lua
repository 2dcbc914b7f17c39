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
