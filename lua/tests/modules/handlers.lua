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

test('isSettingsPath decides without folding only what the fold decides the same way', function()
  local M, internal = load()
  -- Every path of up to three of these pieces, as sent and against each cwd: the pieces that
  -- make the settings file (cased, split by a dropped byte, dotted, spaced, climbing) and
  -- those that do not.
  local pieces = { '/', '\\', '.', '..', ' ', '.settings', '.SeTtInGs', '.set', 'tings', '*', '"',
    '\1', '\200', 'x', 'rom' }
  local cwds = { false, '', 'rom', 'a/..', '.settings', '.set' }
  local checked, settings = 0, 0
  local function check(path)
    for _, cwd in ipairs(cwds) do
      local first = path:sub(1, 1)
      local joined = path
      if first ~= '/' and first ~= '\\' then joined = (cwd or '') .. '/' .. path end
      local expected = internal.foldedSettingsPath(joined)
      eq(M.isSettingsPath(path, cwd or nil), expected, ('%q in %q'):format(path, tostring(cwd)))
      checked = checked + 1
      if expected then settings = settings + 1 end
    end
  end
  local function grow(path, depth)
    check(path)
    if depth == 0 then return end
    for _, piece in ipairs(pieces) do grow(path .. piece, depth - 1) end
  end
  grow('', 3)
  truthy(settings > 1000, ('%d of %d paths name the settings file'):format(settings, checked))
end)

test('filePath checks the path as sent and as resolved, once when they are one string', function()
  local M, internal = load()
  local fsApi = kit.fakes.fs()
  local seen = {}
  local isSettingsPath = M.isSettingsPath
  M.isSettingsPath = function(path, cwd) seen[#seen + 1] = path return isSettingsPath(path, cwd) end
  local function filePath(payload)
    seen = {}
    local refused
    local req = { payload = payload, respond = function(ok, _, err) refused = not ok and err.code end }
    local path = internal.filePath(req, fsApi, true)
    return path or refused, seen
  end
  eq({ filePath({ path = '/a/b.txt' }) }, { 'a/b.txt', { '/a/b.txt' } }, 'canonical: one check')
  eq({ filePath({ path = 'b.txt', cwd = 'a' }) }, { 'a/b.txt', { 'b.txt', '/a/b.txt' } }, 'relative: two')
  eq({ filePath({ path = '/x/../.settings' }) }, { 'forbidden', { '/x/../.settings' } }, 'as sent')
  eq({ filePath({ path = '.settings', cwd = 'a/..' }) }, { 'forbidden', { '.settings' } }, 'relative, as sent')
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
