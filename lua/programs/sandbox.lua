local _VERSION = '0.1.0'

--[[
sandbox: talk to the trapsandbox gateway through the sandbox daemon.
  sandbox setup [URL] [--allow=CAPS]
                       set this computer up: the gateway (URL, or the one the data pack
                       names, or asked), its password and what the agent may do; then the
                       daemon starts (with the data pack, at every boot from then on)
  sandbox health       ask the gateway (wire type probe_gateway) whether it and opencode are up
  sandbox status       show the daemon's connection state, traposId, gateway URL, last error
                       and what the sandbox agent is allowed to do here
  sandbox allow CAP... let the agent use these capabilities on this computer
  sandbox deny CAP...  take them back
  sandbox stop         stop the agent here: every request it has running is cancelled and new
                       ones are refused (also while sandbox.stop_side has a redstone signal)
  sandbox resume       let it act again
  sandbox ask [--new] [--yes] PROMPT...
                       ask the opencode agent; its answer streams onto the screen, it asks
                       y/a/n before each change (unless --yes), Ctrl+T cancels it; --new
                       starts a fresh conversation
  sandbox snapshots    list the gateway's snapshots of this computer's files
  sandbox changes      what changed since the snapshot taken before the last ask
  sandbox undo         show those changes, ask y/N, and bring the files back (a restore takes
                       a snapshot first: it can be undone too, from `sandbox snapshots`)
  sandbox --version | --help
Capabilities (setting sandbox.allow): exec (run programs), eval (run Lua code), fs.read (list
and read files), fs.write (write and delete files), screen (read and watch the terminal), input
(type keys and click on it), peripheral (list, call and watch attached peripherals), turtle
(drive this turtle: move, dig, place); `all` names every one but turtle, which is only ever
allowed by name. exec, eval and input give the agent the
whole computer, including its sandbox password
(file requests cannot touch /.settings; programs and Lua can). allow and deny save the setting and tell the running daemon (OS event
trapos_sandbox_capabilities), which tells the gateway: no reboot needed.
]]

local args = { ... }

-- == Section: Loading libsandbox ==========================================================
-- Owns: finding the library (require under trapos, the file on plain CraftOS).

-- libsandbox lives in /apis: `require` finds it under trapos; plain CraftOS needs dofile.
local function locate()
  local loaded = rawget(_G, 'libsandbox')
  if type(loaded) == 'table' and loaded.request then return loaded end
  local ok, lib = pcall(require, 'libsandbox')
  if ok and type(lib) == 'table' and lib.request then return lib end
  for _, path in ipairs({ '/apis/libsandbox.lua', '/apis/libsandbox', '/lib/libsandbox.lua' }) do
    if fs.exists(path) then return dofile(path) end
  end
  error('libsandbox not found: install /apis/libsandbox.lua', 0)
end

-- == Section: Subcommands =================================================================
-- Owns: what each subcommand does and prints. Needs: libsandbox (consent, request, ask) and
-- the daemon's published state (_G.traposSandboxState).

local function describeAllowed(list)
  if #list == 0 then return 'nothing (run "sandbox allow CAP...")' end
  return table.concat(list, ', ')
end

-- sandbox allow / deny: change sandbox.allow, save it and tell the daemon.
local function change(lib, allow, names)
  local value, listOrError = lib.changeCapabilities(settings.get('sandbox.allow'), allow, names)
  if not value then
    print('sandbox ' .. (allow and 'allow' or 'deny') .. ': ' .. listOrError)
    return false
  end
  if value == '' then settings.unset('sandbox.allow') else settings.set('sandbox.allow', value) end
  if not settings.save() then print('sandbox: could not save settings') end
  os.queueEvent(lib.EVENT_CAPABILITIES)
  print('allowed: ' .. describeAllowed(listOrError))
  if allow and lib.grantsWholeComputer(names) then print('note: ' .. lib.WHOLE_COMPUTER) end
  if allow and lib.grantsTurtle(names) then
    print('note: ' .. lib.MOVING_MACHINE)
    if not rawget(_G, 'turtle') then print('note: this computer is not a turtle') end
  end
  return true
end

-- sandbox stop / resume (SPEC §16): the player's brake, saved in sandbox.stopped; the daemon
-- hears of it at once (OS event trapos_sandbox_stop) and ends what the agent has running.
local function setStopped(lib, stopped)
  if stopped then settings.set('sandbox.stopped', true) else settings.unset('sandbox.stopped') end
  if not settings.save() then print('sandbox: could not save settings') end
  os.queueEvent(lib.EVENT_STOP)
  if stopped then
    print('agent: stopped; whatever it was running here is cancelled. Run "sandbox resume" to let it act again.')
  else
    print('agent: resumed')
    local side = settings.get('sandbox.stop_side')
    if type(side) == 'string' and side ~= '' and redstone and redstone.getInput(side) then
      print('note: the redstone signal on the ' .. side .. ' side still stops it')
    end
  end
end

local function describeError(err)
  if type(err) ~= 'table' then return tostring(err) end
  local message = err.message
  if message == nil or message == '' then return tostring(err.code) end
  return tostring(err.code) .. ' ' .. tostring(message)
end

local function health(lib)
  local ok, result = lib.request('probe_gateway', {})
  if not ok then
    print('sandbox health failed: ' .. describeError(result))
    return false
  end
  print('sandboxOk: ' .. tostring(result.sandboxOk == true))
  print('opencodeOk: ' .. tostring(result.opencodeOk == true))
  -- With several opencode servers the detail names those down even while one is up.
  if result.opencodeOk ~= true or type(result.opencodeDetail) == 'string' then
    print('opencode: ' .. tostring(result.opencodeDetail or 'no detail'))
  end
  return true
end

local function ask(lib, words)
  local new, yes, prompt = false, false, {}
  for _, word in ipairs(words) do
    if #prompt == 0 and word == '--new' then new = true
    elseif #prompt == 0 and word == '--yes' then yes = true
    else prompt[#prompt + 1] = word end
  end
  if #prompt == 0 then
    print('Usage: sandbox ask [--new] [--yes] PROMPT...')
    return false
  end
  local width = term.getSize()
  local column = term.getCursorPos()
  local function newline()
    local _, y = term.getCursorPos()
    local _, h = term.getSize()
    if y >= h then
      term.scroll(1)
      term.setCursorPos(1, h)
    else
      term.setCursorPos(1, y + 1)
    end
  end
  local out = lib.newWrapper(width, term.write, newline, column - 1)
  local ok, result = lib.ask(table.concat(prompt, ' '), { new = new, yes = yes, out = out })
  if out.col > 0 then newline() end
  if not ok then
    if type(result) == 'table' and result.code == 'cancelled' then
      print('sandbox ask: cancelled')
    elseif type(result) == 'table' and result.code == 'stopped' then
      -- sandbox stop (or the stop side's redstone) ended it: the message says how to resume.
      print('sandbox ask: stopped: ' .. tostring(result.message))
    else
      print('sandbox ask failed: ' .. describeError(result))
    end
    return false
  end
  -- The gateway counted the files this ask changed since the snapshot before its first change.
  local changed = type(result) == 'table' and tonumber(result.changed) or 0
  if changed > 0 then
    print(('changed %d %s: sandbox changes / sandbox undo'):format(changed, changed == 1 and 'file' or 'files'))
  end
  return true
end

-- Snapshots (SPEC §15): the gateway asks this computer for its files meanwhile, so these
-- wait longer than a plain request.
local SNAPSHOT_TIMEOUT = 300

local function snapshots(lib)
  local ok, result = lib.request('snapshots', {}, { timeout = SNAPSHOT_TIMEOUT })
  if not ok then
    print('sandbox snapshots failed: ' .. describeError(result))
    return false
  end
  local list = result.snapshots or {}
  if #list == 0 then
    print('no snapshots of this computer yet')
    return true
  end
  for _, each in ipairs(list) do
    local when = type(each.created) == 'number' and os.date('!%Y-%m-%d %H:%M', math.floor(each.created / 1000)) or '?'
    print(('%4s %s %-7s %d files, %d bytes'):format(tostring(each.id), when, tostring(each.reason),
      tonumber(each.files) or 0, tonumber(each.bytes) or 0))
  end
  return true
end

-- Prints what changed since `snapshot` (nil: the one before the last ask); returns the
-- snapshot's id and the number of changes, or nil.
local function showChanges(lib, snapshot)
  local ok, result = lib.request('snapshot_changes', { snapshot = snapshot }, { timeout = SNAPSHOT_TIMEOUT })
  if not ok then
    print('sandbox changes failed: ' .. describeError(result))
    return nil
  end
  local count = 0
  for _, kind in ipairs({ 'added', 'modified', 'deleted' }) do
    for _, change in ipairs(result[kind] or {}) do
      count = count + 1
      print(('%-8s %s'):format(kind, tostring(change.path)))
    end
  end
  if count == 0 then
    print('no changes since snapshot ' .. tostring(result.snapshot))
  else
    print(('%d %s since snapshot %s'):format(count, count == 1 and 'change' or 'changes', tostring(result.snapshot)))
  end
  return result.snapshot, count
end

local function undo(lib, words)
  local snapshot, count = showChanges(lib, words[1])
  if not snapshot or count == 0 then return false end
  write('Undo these changes? [y/N] ')
  local answer = read()
  if answer ~= 'y' and answer ~= 'Y' then
    print('nothing changed')
    return false
  end
  local ok, result = lib.request('snapshot_restore', { snapshot = snapshot }, { timeout = SNAPSHOT_TIMEOUT })
  if not ok then
    print('sandbox undo failed: ' .. describeError(result))
    return false
  end
  print(('restored snapshot %s: %d written, %d deleted'):format(tostring(result.restored),
    #(result.written or {}), #(result.deleted or {})))
  print(('to undo this: sandbox undo %s'):format(tostring(result.before)))
  return true
end

-- Where the daemon is started from: the data pack's autorun, or the installer's startup file.
local AUTORUN = '/rom/autorun/sandbox.lua'
local INSTALLER_STARTUP = '/startup/sandbox-daemon.lua'

-- The gateway a data pack names (its admin built it with the gateway's URL), or nil.
local function packGateway()
  local ok, config = pcall(require, 'sandbox.gateway')
  if ok and type(config) == 'table' and type(config.url) == 'string' and config.url ~= '' then
    return config.url
  end
end

-- sandbox setup [URL] [--allow=CAPS]: what the installer does, for a computer that already has
-- the client (the data pack's ROM): the gateway, the account's secret and the consent questions,
-- saved together; then the daemon starts. Nothing connects and no secret is stored before.
local function setup(lib, words)
  local allowArg, given
  for _, word in ipairs(words) do
    local value = word:match('^%-%-allow=(.*)$')
    if value then allowArg = value elseif not given then given = word end
  end
  local allowValue, notes
  if allowArg then
    allowValue, notes = lib.consentFromArgument(allowArg)
    if not allowValue then
      print('sandbox setup: --allow: ' .. notes)
      return false
    end
  end
  local text = given or packGateway()
  if not text then
    write('gateway (http://HOST:4444): ')
    text = read()
  end
  local url, err = lib.gatewayUrl(text or '')
  if not url then
    print('sandbox setup: ' .. err)
    return false
  end
  print('gateway: ' .. url)
  write('sandbox password (empty for none): ')
  local password = read('*')
  if not allowValue then
    allowValue = lib.askConsent(write, read, rawget(_G, 'turtle') ~= nil)
  else
    for _, note in ipairs(notes) do print('note: ' .. note) end
  end
  settings.set('sandbox.url', url)
  if allowValue ~= '' then settings.set('sandbox.allow', allowValue) else settings.unset('sandbox.allow') end
  if type(password) == 'string' and password ~= '' then
    settings.set('sandbox.password', password)
  else
    settings.unset('sandbox.password')
  end
  if not settings.save() then
    print('sandbox setup: could not save settings')
    return false
  end
  print('sandbox.url = ' .. url)
  print('sandbox.password ' .. ((type(password) == 'string' and password ~= '') and 'set' or 'not set'))
  print('allowed: ' .. describeAllowed(lib.parseCapabilities(allowValue)))
  local daemon = rawget(_G, 'traposSandboxState')
  if daemon and daemon.running and daemon.state ~= 'stopped' then
    print('the sandbox daemon already runs: reboot (hold Ctrl+R) for it to use these settings')
  elseif rawget(_G, 'bootEventLoop') then
    print('trapos: the daemon starts with the trapos-sandbox package; reboot to start it')
  elseif multishell and shell.openTab and (fs.exists(AUTORUN) or fs.exists(INSTALLER_STARTUP)) then
    shell.run(fs.exists(AUTORUN) and AUTORUN or INSTALLER_STARTUP)
    print('daemon started in a new tab. Try: sandbox health')
  else
    print('done. Reboot to start the daemon, then run: sandbox health')
  end
  return true
end

local function allowedLine(lib)
  print('allowed: ' .. describeAllowed(lib.parseCapabilities(settings.get('sandbox.allow'))))
end

local function status(lib, url)
  local state = rawget(_G, 'traposSandboxState')
  if type(state) ~= 'table' or not state.state then
    print('connected: false')
    print('daemon: not running (start /servers/sandbox.lua)')
    print('gateway: ' .. url)
    print('traposId: ' .. lib.traposId(os))
    allowedLine(lib)
    return
  end
  print('connected: ' .. tostring(state.connected == true))
  print('daemon: ' .. (state.running == false and 'stopped' or tostring(state.state)))
  print('traposId: ' .. tostring(state.traposId))
  print('gateway: ' .. tostring(state.url or url))
  if state.lastError then print('last error: ' .. describeError(state.lastError)) end
  allowedLine(lib)
  if state.agentStopped then print('agent: stopped (' .. tostring(state.stopMessage) .. ')') end
end

-- == Section: The command table ===========================================================
-- Owns: every subcommand in one place: its name, whether it needs sandbox.url (consent is
-- local and needs no gateway), its line in the usage text and what runs it.

local COMMANDS = {
  { name = 'setup', needsUrl = false, run = function(lib, rest) setup(lib, rest) end,
    usage = 'setup [URL]   connect this computer: gateway, password, what the agent may do' },
  { name = 'health', needsUrl = true, run = function(lib) health(lib) end,
    usage = 'health        check the sandbox gateway and opencode' },
  { name = 'status', needsUrl = true, run = function(lib, _, url) status(lib, url) end,
    usage = 'status        show the daemon connection and what is allowed' },
  { name = 'allow', needsUrl = false, run = function(lib, rest) change(lib, true, rest) end,
    usage = 'allow CAP...  let the agent: exec, eval, fs.read, fs.write, screen, input, peripheral, turtle or all' },
  { name = 'deny', needsUrl = false, run = function(lib, rest) change(lib, false, rest) end,
    usage = 'deny CAP...   take capabilities back' },
  { name = 'stop', needsUrl = false, run = function(lib) setStopped(lib, true) end,
    usage = 'stop          stop the agent here: cancel what it runs, refuse the rest' },
  { name = 'resume', needsUrl = false, run = function(lib) setStopped(lib, false) end,
    usage = 'resume        let the agent act here again after stop' },
  { name = 'ask', needsUrl = true, run = function(lib, rest) ask(lib, rest) end,
    usage = 'ask [--new] [--yes] PROMPT...  ask the agent (Ctrl+T cancels)' },
  { name = 'snapshots', needsUrl = true, run = function(lib) snapshots(lib) end,
    usage = 'snapshots     list the snapshots of this computer\'s files' },
  { name = 'changes', needsUrl = true, run = function(lib, rest) showChanges(lib, rest[1]) end,
    usage = 'changes [ID]  what changed since the last ask (or snapshot ID)' },
  { name = 'undo', needsUrl = true, run = function(lib, rest) undo(lib, rest) end,
    usage = 'undo [ID]     undo the last ask\'s changes (asks y/N first)' },
}

local function usage()
  print('Usage: sandbox <command>')
  for _, command in ipairs(COMMANDS) do print('  ' .. command.usage) end
  print('  --version     print the version')
  print('Settings: sandbox.url (ws://host:4444/gateway), sandbox.password, sandbox.allow')
end

local function findCommand(name)
  for _, command in ipairs(COMMANDS) do
    if command.name == name then return command end
  end
end

-- == Section: Main ========================================================================

local lib = locate()
lib.defineSettings()

local name = args[1]
if name == '--version' or name == '-v' then
  print('sandbox ' .. _VERSION)
  return
end
if name == nil or name == '--help' or name == '-h' or name == 'help' then
  usage()
  return
end
local command = findCommand(name)
local url = settings.get('sandbox.url')
-- An unknown command is answered like one that needs the gateway: without sandbox.url, say that.
if (not command or command.needsUrl) and (type(url) ~= 'string' or url == '') then
  print('set sandbox.url first')
  print('(or run: sandbox setup)')
  return
end
if not command then
  print('sandbox: unknown command ' .. tostring(name))
  usage()
  return
end
command.run(lib, { table.unpack(args, 2) }, url)
