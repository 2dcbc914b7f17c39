local _VERSION = '0.1.0'

-- Unit tests for sandbox/requests.lua: the request table, with the handler modules it lists.
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

local MODULES = { 'core', 'consent', 'encoding', 'wire', 'loop', 'capture', 'screen', 'jobs',
  'handlers', 'exec', 'files', 'snapshot', 'console', 'peripherals', 'requests' }

test('every request type has a handler and a known capability or none', function()
  local M = kit.modules(table.unpack(MODULES))
  local known = {}
  for _, name in ipairs(M.CAPABILITIES) do known[name] = true end
  local count = 0
  for msgType, handler in pairs(M.requestHandlers) do
    count = count + 1
    eq(type(handler), 'function', msgType .. '\'s handler')
    local capability = M.REQUEST_CAPABILITY[msgType]
    truthy(capability == nil or known[capability], msgType .. ': ' .. tostring(capability))
  end
  eq(count, 19, 'request types')
  eq(M.REQUEST_CAPABILITY.ping, nil, 'ping needs nothing')
  eq(M.REQUEST_CAPABILITY.cancel, nil, 'cancel needs nothing')
  eq(M.REQUEST_CAPABILITY.write_file, 'fs.write', 'write_file')
  eq(M.REQUEST_CAPABILITY.write_files, 'fs.write', 'write_files')
end)

test('every capability guards some request', function()
  local M = kit.modules(table.unpack(MODULES))
  local used = {}
  for _, capability in pairs(M.REQUEST_CAPABILITY) do used[capability] = true end
  for _, name in ipairs(M.CAPABILITIES) do truthy(used[name], name .. ' guards a request') end
end)

return kit.suite()
