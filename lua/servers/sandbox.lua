local _VERSION = '0.1.0'

--[[
sandbox daemon: keeps one WebSocket to the trapsandbox gateway and bridges it to OS events
(see /apis/libsandbox.lua). Under trapos (`_G.bootEventLoop`) it registers its handlers and
returns; on plain CraftOS it runs its own event loop forever, so start it in the background:
`bg /servers/sandbox.lua`, or from startup (the installer adds /startup/sandbox-daemon.lua).
Settings: sandbox.url (required), sandbox.password, and sandbox.allow: what the gateway may ask
of this computer (exec, eval, fs.read, fs.write, screen, input; see `sandbox allow`). It runs
the programs the gateway asks for with this shell, in coroutines beside itself, drawing on the
shell's terminal (_G.traposSandboxScreen, set by the installer's startup file) or its own. The
screen it reports is the computer's whole screen, recorded by the daemon itself however it was
started (installer's startup, trapos autostart, or shell.run from your own startup). Ctrl+T
does not stop it: the terminate reaches a program it runs for the gateway instead.
]]

-- libsandbox lives in /apis: `require` finds it under trapos; plain CraftOS needs dofile.
local function locate()
  local loaded = rawget(_G, 'libsandbox')
  if type(loaded) == 'table' and loaded.startSession then return loaded end
  local ok, lib = pcall(require, 'libsandbox')
  if ok and type(lib) == 'table' and lib.startSession then return lib end
  for _, path in ipairs({ '/apis/libsandbox.lua', '/apis/libsandbox', '/lib/libsandbox.lua' }) do
    if fs.exists(path) then return dofile(path) end
  end
  error('libsandbox not found: install /apis/libsandbox.lua', 0)
end

local lib = locate()
lib.defineSettings()

local url = settings.get('sandbox.url')
if type(url) ~= 'string' or url == '' then
  print('sandbox daemon inactive: sandbox.url not set')
  return
end
if not (http and http.websocketAsync) then
  print('sandbox daemon inactive: http.websocketAsync unavailable (enable websockets in the http config)')
  return
end

-- One daemon per computer: a second one (the installer run again from startup.lua beside
-- /startup/sandbox-daemon.lua, a `bg` by hand) would only fight the first for the gateway,
-- which keeps the newest connection. One that stopped for good (wrong password, replaced)
-- is stopped properly, so it no longer answers programs, and a new one starts.
local running = rawget(_G, 'traposSandboxSession')
if type(running) == 'table' and type(running.status) == 'function' then
  local okStatus, status = pcall(running.status)
  if okStatus and type(status) == 'table' and status.running and status.state ~= 'stopped' then
    print(('sandbox daemon already running (%s, %s): not starting another'):format(tostring(status.state), tostring(status.url)))
    return
  end
  if type(running.stop) == 'function' then pcall(running.stop) end
end

local password = settings.get('sandbox.password')
if type(password) ~= 'string' then password = nil end

local bootLoop = rawget(_G, 'bootEventLoop')
local loop = bootLoop or lib.createEventLoop(os)
-- `shell` is this program's own (the shell API is not a global): exec runs programs with it.
local session = lib.startSession({
  url = url, secret = password, eventLoop = loop, shell = shell, multishell = multishell,
})
_G.traposSandboxSession = session
print(('sandbox daemon %s: connecting to %s as %s'):format(_VERSION, url, session.traposId))
local allowed = session.status().capabilities
print('allowed: ' .. (#allowed > 0 and table.concat(allowed, ', ') or 'nothing (see "sandbox allow")'))

if not bootLoop then
  -- Should the loop ever end (an error in it), the session says it no longer runs, so the
  -- daemon can be started again.
  local ok, err = pcall(loop.run)
  session.stop()
  if not ok then error(err, 0) end
end
