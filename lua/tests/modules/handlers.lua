local _VERSION = '0.1.0'

-- Unit tests for sandbox/handlers.lua alone: what every handler shares, ping, /.settings.
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

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

test('ping answers with the traposId', function()
  local _, internal = load()
  local answered
  local req = { payload = {}, respond = function(ok, payload) answered = { ok, payload } end }
  internal.handlePing(req, { traposId = '7:lab' })
  eq(answered, { true, { traposId = '7:lab' } }, 'answer')
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
