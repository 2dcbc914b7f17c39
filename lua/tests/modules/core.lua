local _VERSION = '0.1.0'

-- Unit tests for sandbox/core.lua alone: the constants, cc.expect and errorValue.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

test('core puts the version, the limits and the event names in M', function()
  local M = kit.modules('core')
  eq(M._VERSION, _VERSION, '_VERSION')
  eq(M.MAX_SEND, 128 * 1024, 'MAX_SEND: what CC:Tweaked sends at most')
  truthy(M.PARTIAL_MAX_BYTES * 6 < M.MAX_SEND, 'a partial escaped 6x still fits a frame')
  for _, name in ipairs({ 'EVENT_SEND', 'EVENT_REPLY', 'EVENT_PARTIAL', 'EVENT_CONNECTED', 'EVENT_CAPABILITIES', 'EVENT_STOP' }) do
    truthy(M[name]:find('^trapos_sandbox_'), name .. ' is a trapos_sandbox_ event')
  end
end)

test('expect is cc.expect from the ROM', function()
  local _, internal = kit.modules('core')
  eq(internal.expect, require('cc.expect').expect, 'the ROM\'s function')
  local function greet(name) internal.expect(1, name, 'string', 'nil') end
  raises(function() greet(3) end, 'bad argument #1 .-%(string expected, got number%)', 'a number')
  eq(internal.field, require('cc.expect').field, 'and its field check')
end)

test('expectNonEmpty blames the caller in cc.expect\'s words', function()
  local _, internal = kit.modules('core')
  local function named(id)
    local checked = internal.expectNonEmpty(1, id) -- not a tail call: named's caller is blamed
    return checked
  end
  eq(named('7:'), '7:', 'a string is returned')
  raises(function() named('') end, '^[^:]*:%d+: bad argument #1 %(non%-empty string expected, got empty string%)', 'empty')
  raises(function() named(nil) end, 'bad argument #1 %(non%-empty string expected, got nil%)', 'nil')
end)

test('errorValue is the code and message of every failure', function()
  local M, internal = kit.modules('core')
  eq(M.errorValue('bad_request', 'no path'), { code = 'bad_request', message = 'no path' }, 'value')
  eq(internal.errorValue, M.errorValue, 'shared with the other modules')
end)

return kit.suite()
