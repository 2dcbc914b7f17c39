local _VERSION = '0.1.0'

--[[
trapsandbox client installer.

  wget run http://HOST:4444/client/install.lua [password]

The gateway serves this file with the token __TRAPSANDBOX_BASE_URL__ on the BASE_URL line
below replaced by its own base URL (e.g. http://HOST:4444, no trailing slash). Run unserved,
give the base URL first: `install.lua http://HOST:4444 [password]`.

It downloads /client/apis/libsandbox.lua, /client/servers/sandbox.lua and
/client/programs/sandbox.lua into /apis, /servers and /programs, sets sandbox.url to the
gateway's ws(s)://HOST:PORT/gateway and sandbox.password (argument, or asked for), saves the
settings and, on plain CraftOS (no trapos), writes /startup/sandbox-daemon.lua, which makes
`sandbox` runnable and starts the daemon in the background.
]]

local BASE_URL = '__TRAPSANDBOX_BASE_URL__'

local FILES = {
  { remote = 'client/apis/libsandbox.lua', path = '/apis/libsandbox.lua' },
  { remote = 'client/servers/sandbox.lua', path = '/servers/sandbox.lua' },
  { remote = 'client/programs/sandbox.lua', path = '/programs/sandbox.lua' },
}
local STARTUP = '/startup/sandbox-daemon.lua'

local STARTUP_SOURCE = [[
-- Written by the trapsandbox installer: makes `sandbox` runnable and starts its daemon.
shell.setAlias('sandbox', '/programs/sandbox.lua')
if multishell and shell.openTab then
  local tab = shell.openTab('/servers/sandbox.lua')
  if tab and multishell.setTitle then multishell.setTitle(tab, 'sandbox') end
  if tab and multishell.setFocus then multishell.setFocus(multishell.getCurrent()) end
else
  -- No multishell (a basic computer): run the daemon beside a fresh shell.
  parallel.waitForAny(
    function() shell.run('/servers/sandbox.lua') while true do os.pullEvent() end end,
    function() shell.run('/rom/programs/shell.lua') end
  )
  os.shutdown()
end
]]

local args = { ... }

local function fail(message)
  local printErr = printError or print
  printErr('install failed: ' .. message)
  error('', 0)
end

local function trimSlash(url)
  return (url:gsub('/+$', ''))
end

local base = BASE_URL
if base:sub(1, 2) == '__' then
  base = table.remove(args, 1)
  if type(base) ~= 'string' or not base:find('^https?://') then
    fail('not served by a gateway; run: install.lua http://HOST:4444 [password]')
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

dofile('/apis/libsandbox.lua').defineSettings()
settings.set('sandbox.url', gatewayUrl)
if password ~= nil and password ~= '' then
  settings.set('sandbox.password', password)
else
  settings.unset('sandbox.password')
end
if not settings.save() then fail('could not save settings') end
print('sandbox.url = ' .. gatewayUrl)
print('sandbox.password ' .. ((password ~= nil and password ~= '') and 'set' or 'not set'))

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

if not rawget(_G, 'bootEventLoop') and multishell and shell and shell.openTab and fs.exists(STARTUP) then
  shell.run(STARTUP)
  print('daemon started in a new tab. Try: sandbox health')
else
  print('done. Reboot to start the daemon, then run: sandbox health')
end
