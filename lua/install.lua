local _VERSION = '0.1.0'

--[[
trapsandbox client installer.

  wget run http://HOST:4444/client/install.lua [password] [--allow=CAPS]

The gateway serves this file with the token __TRAPSANDBOX_BASE_URL__ on the BASE_URL line
below replaced by its own base URL (e.g. http://HOST:4444, no trailing slash). Run unserved,
give the base URL first: `install.lua http://HOST:4444 [password] [--allow=CAPS]`.

It downloads /client/apis/libsandbox.lua, /client/servers/sandbox.lua,
/client/programs/sandbox.lua and the help pages into /apis, /servers, /programs and /help, sets sandbox.url to the
gateway's ws(s)://HOST:PORT/gateway and sandbox.password (argument, or asked for), asks once
whether the sandbox agent may act on this computer (sandbox.allow: y allows exec, eval,
fs.read, fs.write, screen, input and peripheral; a turtle is asked separately for turtle; anything else allows nothing), saying that exec, eval
and input give it the whole computer, sandbox password included; saves the settings and, on plain
CraftOS (no trapos), writes /startup/sandbox-daemon.lua, which makes `sandbox` runnable,
starts the daemon in the background and keeps the screen readable for `screen` requests.

For scripted installs, --allow=all, --allow=none or --allow=exec,fs.read (any of the eight; all leaves out turtle)
presets sandbox.allow and skips the question. It can be changed later with `sandbox allow` /
`sandbox deny`.
]]

local BASE_URL = '__TRAPSANDBOX_BASE_URL__'

local FILES = {
  { remote = 'client/apis/libsandbox.lua', path = '/apis/libsandbox.lua' },
  { remote = 'client/servers/sandbox.lua', path = '/servers/sandbox.lua' },
  { remote = 'client/programs/sandbox.lua', path = '/programs/sandbox.lua' },
  { remote = 'client/help/sandbox.txt', path = '/help/sandbox.txt' },
  { remote = 'client/help/sandbox-ask.txt', path = '/help/sandbox-ask.txt' },
  { remote = 'client/help/sandbox-allow.txt', path = '/help/sandbox-allow.txt' },
  { remote = 'client/help/sandbox-stop.txt', path = '/help/sandbox-stop.txt' },
  { remote = 'client/help/sandbox-snapshots.txt', path = '/help/sandbox-snapshots.txt' },
}
local STARTUP = '/startup/sandbox-daemon.lua'

-- The screen: the native terminal cannot be read back, so the daemon reports the terminal
-- recorded in _G.traposSandboxScreen, which must be a window (it has getLine). Under
-- multishell that is the window of this first tab (what the player sees while it is in
-- front); on a basic computer the whole screen is wrapped in a window that the shell and the
-- daemon share. Without the window API nothing is recorded and `screen` says why.
local STARTUP_SOURCE = [[
-- Written by the trapsandbox installer: makes `sandbox` runnable, starts its daemon and keeps
-- the screen readable (_G.traposSandboxScreen) for the gateway's `screen` requests.
shell.setAlias('sandbox', '/programs/sandbox.lua')
-- `help sandbox`, Tab after `sandbox ` and `set sandbox.allow` explaining it (the data pack's
-- autorun does the same where the pack is installed).
if help and help.path and help.setPath and not (':' .. help.path() .. ':'):find(':/help:', 1, true) then
  help.setPath(help.path() .. ':/help')
end
local okLib, lib = pcall(dofile, '/apis/libsandbox.lua')
if okLib and type(lib) == 'table' and lib.complete then
  lib.defineSettings()
  shell.setCompletionFunction('programs/sandbox.lua', lib.complete)
end
local function readable(t) return type(t) == 'table' and type(t.getLine) == 'function' end
local daemon = rawget(_G, 'traposSandboxState')
if daemon and daemon.running and daemon.state ~= 'stopped' then
  return -- already started this boot (the installer run from startup.lua, say)
end
if multishell and shell.openTab then
  -- The shell's tab is a window (readable); a terminal that is not gets one over it.
  local current = term.current()
  if window and not readable(current) then
    local width, height = current.getSize()
    current = window.create(current, 1, 1, width, height, true)
    term.redirect(current)
  end
  if readable(current) then _G.traposSandboxScreen = current end
  local tab = shell.openTab('/servers/sandbox.lua')
  if tab and multishell.setTitle then multishell.setTitle(tab, 'sandbox') end
  if tab and multishell.setFocus then multishell.setFocus(multishell.getCurrent()) end
else
  -- No multishell (a basic computer): run the daemon beside a fresh shell, in one window.
  local native = term.current()
  if window and not readable(native) then
    local width, height = native.getSize()
    local screen = window.create(native, 1, 1, width, height, true)
    term.redirect(screen)
    _G.traposSandboxScreen = screen
  elseif readable(native) then
    _G.traposSandboxScreen = native
  end
  parallel.waitForAny(
    function() shell.run('/servers/sandbox.lua') while true do os.pullEvent() end end,
    function() shell.run('/rom/programs/shell.lua') end
  )
  term.redirect(native)
  os.shutdown()
end
]]

local args = { ... }

local function fail(message)
  local printErr = printError or print
  printErr('install failed: ' .. message)
  error('', 0)
end

-- --allow=CAPS may stand anywhere among the arguments.
local allowArg
for i = #args, 1, -1 do
  local value = type(args[i]) == 'string' and args[i]:match('^%-%-allow=(.*)$')
  if value then
    allowArg = value
    table.remove(args, i)
  end
end

local function trimSlash(url)
  return (url:gsub('/+$', ''))
end

local base = BASE_URL
if base:sub(1, 2) == '__' then
  base = table.remove(args, 1)
  if type(base) ~= 'string' or not base:find('^https?://') then
    fail('not served by a gateway; run: install.lua http://HOST:4444 [password] [--allow=CAPS]')
  end
end
base = trimSlash(base)

local gatewayUrl
if base:find('^https://') then
  gatewayUrl = 'wss://' .. base:sub(9) .. '/gateway'
elseif base:find('^http://') then
  gatewayUrl = 'ws://' .. base:sub(8) .. '/gateway'
else
  fail('base URL must start with http:// or https://: ' .. base)
end

if not http then fail('the http API is disabled on this computer') end

print('trapsandbox installer ' .. _VERSION .. ' from ' .. base)

local function download(remote, path)
  local url = base .. '/' .. remote
  write('  ' .. path .. ' ... ')
  local response, err = http.get(url)
  if not response then
    print('failed')
    fail(url .. ': ' .. tostring(err))
  end
  local code = response.getResponseCode and response.getResponseCode() or 200
  local body = response.readAll()
  response.close()
  if code ~= 200 or type(body) ~= 'string' or body == '' then
    print('failed')
    fail(url .. ': HTTP ' .. tostring(code))
  end
  local dir = fs.getDir(path)
  if dir ~= '' and not fs.exists(dir) then fs.makeDir(dir) end
  local file = fs.open(path, 'w')
  if not file then
    print('failed')
    fail('cannot write ' .. path)
  end
  file.write(body)
  file.close()
  print('ok (' .. #body .. ' bytes)')
end

print('downloading:')
for _, f in ipairs(FILES) do download(f.remote, f.path) end

local password = args[1]
if password == nil then
  write('sandbox password (empty for none): ')
  password = read('*')
end

local lib = dofile('/apis/libsandbox.lua')
lib.defineSettings()

-- Consent, asked once in plain words unless --allow= preset it (the same questions as
-- `sandbox setup`: libsandbox asks them).
local allowValue
if allowArg ~= nil then
  local notes
  allowValue, notes = lib.consentFromArgument(allowArg)
  if not allowValue then fail('--allow: ' .. notes) end
  for _, note in ipairs(notes) do print('note: ' .. note) end
else
  allowValue = lib.askConsent(write, read, rawget(_G, 'turtle') ~= nil)
end

settings.set('sandbox.url', gatewayUrl)
if allowValue ~= '' then settings.set('sandbox.allow', allowValue) else settings.unset('sandbox.allow') end
if password ~= nil and password ~= '' then
  settings.set('sandbox.password', password)
else
  settings.unset('sandbox.password')
end
if not settings.save() then fail('could not save settings') end
print('sandbox.url = ' .. gatewayUrl)
print('sandbox.password ' .. ((password ~= nil and password ~= '') and 'set' or 'not set'))
if allowValue ~= '' then
  print('sandbox.allow = ' .. allowValue)
else
  print('sandbox.allow: nothing allowed (later: sandbox allow exec eval fs.read fs.write screen input peripheral)')
end

if rawget(_G, 'bootEventLoop') then
  print('trapos detected: the daemon starts with the trapos-sandbox package (servers/sandbox).')
else
  if fs.exists('/startup') and not fs.isDir('/startup') then
    print('note: /startup is a file; add this line to it yourself:')
    print("  shell.run('/servers/sandbox.lua')")
  else
    if not fs.exists('/startup') then fs.makeDir('/startup') end
    local file = fs.open(STARTUP, 'w')
    if not file then fail('cannot write ' .. STARTUP) end
    file.write(STARTUP_SOURCE)
    file.close()
    print('startup entry: ' .. STARTUP)
  end
  if shell and shell.setAlias then shell.setAlias('sandbox', '/programs/sandbox.lua') end
end

local daemon = rawget(_G, 'traposSandboxState')
if daemon and daemon.running and daemon.state ~= 'stopped' then
  print('the sandbox daemon already runs: reboot (hold Ctrl+R) for it to use these settings')
elseif not rawget(_G, 'bootEventLoop') and multishell and shell and shell.openTab and fs.exists(STARTUP) then
  shell.run(STARTUP)
  print('daemon started in a new tab. Try: sandbox health')
else
  print('done. Reboot to start the daemon, then run: sandbox health')
end
