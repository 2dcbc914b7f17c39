local _VERSION = '0.1.0'

-- Unit tests for sandbox/handlers.lua alone: what every handler shares, ping, /.settings.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

local function load()
  return kit.modules('core', 'encoding', 'handlers')
end

test('isSettingsPath knows every spelling of /.settings and no other path', function()
  local M = load()
  for _, spelling in ipairs({ '/.settings', '.settings', '//.SETTINGS', '/x/../.settings', '/.settings.', '/"*.settings' }) do
    eq(M.isSettingsPath(spelling), true, spelling)
  end
  eq(M.isSettingsPath('../.settings', 'rom'), true, 'relative to a folder')
  for _, other in ipairs({ '/settings', '/a/.settings', '/.settings2', '/rom/.settings' }) do
    eq(M.isSettingsPath(other), false, other)
  end
end)

test('optionalNumber takes a default, a floor and a ceiling', function()
  local _, internal = load()
  eq(internal.optionalNumber({}, 'n', 7, 1), 7, 'default')
  eq(internal.optionalNumber({ n = 2.9 }, 'n', 7, 1), 2, 'whole')
  eq(internal.optionalNumber({ n = 99 }, 'n', 7, 1, 10), 10, 'ceiling')
  local none, message = internal.optionalNumber({ n = 0 }, 'n', 7, 1)
  eq(none, nil, 'below the floor')
  eq(message, 'n must be a number of at least 1', 'message')
end)

test('ping is registered, needing no capability, and answers with the traposId', function()
  local _, internal = load()
  local ping = internal.closeRequests().ping
  eq(ping.capability, nil, 'capability')
  local answered
  local req = { payload = {}, respond = function(ok, payload) answered = { ok, payload } end }
  ping.handler(req, { traposId = '7:lab' })
  eq(answered, { true, { traposId = '7:lab' } }, 'answer')
end)

test('a request type registers once, with a name, a capability or none, and a handler', function()
  local _, internal = load()
  local function handler() end
  internal.registerRequest('echo', 'exec', handler)
  raises(function() internal.registerRequest('echo', nil, handler) end,
    'modules/handlers%.lua:%d+: request type echo registered twice$', 'twice')
  raises(function() internal.registerRequest('', nil, handler) end,
    'bad argument #1 %(non%-empty string expected, got empty string%)', 'no name')
  raises(function() internal.registerRequest('x', true, handler) end,
    'bad argument #2 .-%(string expected, got boolean%)', 'a capability is a name')
  raises(function() internal.registerRequest('x', nil, 'handler') end,
    'bad argument #3 .-%(function expected, got string%)', 'a handler is a function')
  local registered = internal.closeRequests()
  eq(registered.echo, { capability = 'exec', handler = handler }, 'registered')
  eq(registered.x, nil, 'refused ones are not registered')
  raises(function() internal.registerRequest('late', nil, handler) end,
    'request type late registered after the request table was made', 'after the table')
end)

test('badRequest and fsError answer with their codes', function()
  local _, internal = load()
  local errors = {}
  local req = { respond = function(ok, _, err) errors[#errors + 1] = { ok, err.code, err.message } end }
  internal.badRequest(req, 'no path')
  internal.fsError(req, 'Access denied')
  eq(errors, { { false, 'bad_request', 'no path' }, { false, 'fs_error', 'Access denied' } }, 'answers')
  truthy(internal.errorText('/x.lua:3: Access denied'):find('^Access denied'), 'no file:line prefix')
end)

return kit.suite()
