local _VERSION = '0.1.0'

-- Unit tests for sandbox/encoding.lua alone: base64, payload and error coercion, JSON lists.
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

test('base64 matches RFC 4648 and round-trips every byte', function()
  local M = kit.modules('core', 'encoding')
  eq(M.base64Encode(''), '', 'empty')
  eq(M.base64Encode('M'), 'TQ==', 'one byte')
  eq(M.base64Encode('Ma'), 'TWE=', 'two bytes')
  eq(M.base64Encode('Man'), 'TWFu', 'three bytes')
  local bytes = {}
  for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
  local all = table.concat(bytes):rep(9) -- more than one BASE64_GROUP
  eq(M.base64Decode(M.base64Encode(all)), all, 'round trip')
  eq(M.base64Decode('TW\nFu'), 'Man', 'whitespace ignored')
end)

test('base64Decode says what is wrong', function()
  local M = kit.modules('core', 'encoding')
  local none, message = M.base64Decode('TWF')
  eq(none, nil, 'short')
  truthy(message:find('multiple of 4'), message)
  none, message = M.base64Decode('TW!u')
  eq(none, nil, 'not base64')
  truthy(message:find('not base64'), message)
end)

test('payloads and errors are coerced as SPEC 2 says', function()
  local M = kit.modules('core', 'encoding')
  eq(M.coercePayload({ path = '/' }), { path = '/' }, 'an object')
  eq(M.coercePayload({ 1, 2 }), {}, 'a list')
  eq(M.coercePayload('x'), {}, 'a scalar')
  eq(M.coerceError({ code = 'fs_error', message = 'No such file' }), { code = 'fs_error', message = 'No such file' }, 'kept')
  eq(M.coerceError({ code = '' }, 'lost').code, 'internal', 'no code')
  eq(M.coerceError(nil, 'lost').message, 'lost', 'the fallback message')
end)

test('jsonList is textutils.empty_json_array when empty, where there is one', function()
  local _, internal = kit.modules('core', 'encoding')
  eq(internal.jsonList({ 'a' }), { 'a' }, 'a list as it is')
  local saved = rawget(_G, 'textutils')
  kit.onCleanup(function() rawset(_G, 'textutils', saved) end)
  local empty = {}
  rawset(_G, 'textutils', { empty_json_array = empty })
  eq(internal.jsonList({}) == empty, true, 'the empty list marker')
end)

return kit.suite()
