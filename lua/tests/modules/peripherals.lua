local _VERSION = '0.1.0'

-- Unit tests for sandbox/peripherals.lua: Lua values as JSON, and the peripheral requests.
local kit = ...
local test, eq = kit.test, kit.eq

local MODULES = { 'core', 'encoding', 'loop', 'capture', 'screen', 'jobs', 'handlers', 'console',
  'peripherals', 'requests' }

test('toJsonValue keeps what JSON can carry and names the rest', function()
  local M = kit.modules(table.unpack(MODULES))
  eq(M.toJsonValue('s'), 's', 'string')
  eq(M.toJsonValue(1.5), 1.5, 'number')
  eq(M.toJsonValue(0 / 0), tostring(0 / 0), 'NaN as text')
  eq(M.toJsonValue({ 1, 'two', { x = true } }), { 1, 'two', { x = true } }, 'nested')
  eq(M.toJsonValue({ [1] = 'a', [3] = 'c' }), { ['1'] = 'a', ['3'] = 'c' }, 'a list with a hole is an object')
  eq(M.toJsonValue(print), 'function', 'a function')
  local cycle = {}
  cycle.self = cycle
  eq(M.toJsonValue(cycle), { self = 'table' }, 'a cycle')
end)

test('list_peripherals without the peripheral API is a peripheral_error', function()
  local M = kit.modules(table.unpack(MODULES))
  local saved = rawget(_G, 'peripheral')
  kit.onCleanup(function() rawset(_G, 'peripheral', saved) end)
  rawset(_G, 'peripheral', nil)
  local answer
  local req = { payload = {} }
  function req.respond(ok, result, err) answer = { ok, result, err } end
  M.requestHandlers.list_peripherals(req, { session = {} })
  eq(answer[1], false, 'refused')
  eq(answer[3].code, 'peripheral_error', 'code')
end)

return kit.suite()
