local _VERSION = '0.1.0'

--[[
The trapsandbox data pack's autorun (rom/autorun/sandbox.lua), run by the ROM's startup on
every computer of the world at boot, before the player's own startup:

- defines the sandbox.* settings (so `set` explains them) and registers the `sandbox` command's
  completion (for the ROM's program and for one the installer put in /programs);
- on a computer whose player has set it up (`sandbox setup`, or the installer: sandbox.url is
  saved), starts the daemon once, as the installer's /startup/sandbox-daemon.lua does: in a
  multishell tab, or on a computer without multishell beside a fresh shell in one window.
  Anywhere else nothing connects.

`sandbox setup` runs this file again to start the daemon at once.
]]

local DAEMON = '/rom/sandbox/daemon.lua'

local ok, lib = pcall(require, 'libsandbox')
if not ok or type(lib) ~= 'table' then
  if printError then printError('sandbox: ' .. tostring(lib)) end
  return
end
lib.defineSettings()
if shell and shell.setCompletionFunction then
  shell.setCompletionFunction('rom/programs/sandbox.lua', lib.complete)
  shell.setCompletionFunction('programs/sandbox.lua', lib.complete)
end
if help and help.path and help.setPath and not (':' .. help.path() .. ':'):find(':/help:', 1, true) then
  help.setPath(help.path() .. ':/help')
end

if not lib.isSetUp() or rawget(_G, 'bootEventLoop') then return end -- trapos starts its own
if not (http and http.websocketAsync) then return end
local daemon = rawget(_G, 'traposSandboxState')
if daemon and daemon.running and daemon.state ~= 'stopped' then return end -- one per computer

local function readable(t) return type(t) == 'table' and type(t.getLine) == 'function' end
if multishell and shell.openTab then
  -- The shell's tab is a window (readable); a terminal that is not gets one over it.
  local current = term.current()
  if window and not readable(current) then
    local width, height = current.getSize()
    current = window.create(current, 1, 1, width, height, true)
    term.redirect(current)
  end
  if readable(current) then _G.traposSandboxScreen = current end
  local tab = shell.openTab(DAEMON)
  if tab and multishell.setTitle then multishell.setTitle(tab, 'sandbox') end
  if tab and multishell.setFocus then multishell.setFocus(multishell.getCurrent()) end
  return
end

-- No multishell (a basic computer): the daemon beside a fresh shell, in one window. This autorun
-- never returns, so the ROM's startup goes no further: what it would still have run runs
-- here, once (running /rom/startup.lua again would run every autorun a second time): the
-- autoruns after this one, the message of the day, the player's startup (the ROM's own
-- order and rules; its findStartups is local to it). The installer's startup file, if there
-- is one, then finds the daemon running and returns.
local function startupsIn(base)
  local found, path = nil, '/' .. fs.combine(base, 'startup')
  local program = shell.resolveProgram(path)
  if program then found = { program } end
  if fs.isDir(path) then
    found = found or {}
    for _, name in ipairs(fs.list(path)) do
      local each = '/' .. fs.combine(path, name)
      if not fs.isDir(each) then found[#found + 1] = each end
    end
  end
  return found
end

local function restOfBoot()
  local mine = fs.getName(shell.getRunningProgram())
  for _, name in ipairs(fs.list('/rom/autorun')) do
    local each = '/rom/autorun/' .. name
    if name > mine and name:sub(1, 1) ~= '.' and not fs.isDir(each) then shell.run(each) end
  end
  if settings.get('motd.enable') then shell.run('motd') end
  local chosen = settings.get('shell.allow_startup') and startupsIn('/') or nil
  if settings.get('shell.allow_disk_startup') then
    for _, side in pairs(peripheral.getNames()) do
      if disk.isPresent(side) and disk.hasData(side) then
        local found = startupsIn(disk.getMountPath(side))
        if found then chosen = found break end
      end
    end
  end
  for _, each in ipairs(chosen or {}) do shell.run(each) end
end

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
  function() shell.run(DAEMON) while true do os.pullEvent() end end,
  function()
    restOfBoot()
    shell.run('/rom/programs/shell.lua')
  end
)
term.redirect(native)
os.shutdown()
