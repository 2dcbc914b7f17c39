local _VERSION = '0.1.0'

-- Unit tests for sandbox/requests.lua: the request table, made of what the handler modules
-- registered.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

local MODULES = { 'core', 'consent', 'encoding', 'wire', 'loop', 'capture', 'screen', 'jobs',
  'handlers', 'exec', 'files', 'snapshot', 'console', 'peripherals', 'requests' }

-- Each type, the capability it needs (false: none) and the module that registers it.
local EXPECTED = {
  ping = { false, 'handlers' }, exec = { 'exec', 'exec' }, eval = { 'eval', 'exec' },
  cancel = { false, 'exec' }, list_files = { 'fs.read', 'files' },
  read_file = { 'fs.read', 'files' }, write_file = { 'fs.write', 'files' },
  write_files = { 'fs.write', 'files' }, delete_file = { 'fs.write', 'files' },
  move_file = { 'fs.write', 'files' }, make_folder = { 'fs.write', 'files' },
  screen = { 'screen', 'console' }, screen_watch = { 'screen', 'console' },
  input = { 'input', 'console' }, snapshot_list = { 'fs.read', 'snapshot' },
  list_peripherals = { 'peripheral', 'peripherals' },
  call_peripheral = { 'peripheral', 'peripherals' },
  peripheral_events = { 'peripheral', 'peripherals' }, turtle = { 'turtle', 'peripherals' },
}

test('every request type has a handler and the capability it always needed', function()
  local M = kit.modules(table.unpack(MODULES))
  local known = {}
  for _, name in ipairs(M.CAPABILITIES) do known[name] = true end
  local types = {}
  for msgType, handler in pairs(M.requestHandlers) do
    types[msgType] = true
    eq(type(handler), 'function', msgType .. '\'s handler')
    local capability = M.REQUEST_CAPABILITY[msgType]
    truthy(capability == nil or known[capability], msgType .. ': ' .. tostring(capability))
  end
  for msgType in pairs(M.REQUEST_CAPABILITY) do
    truthy(types[msgType], msgType .. ' has a capability but no handler')
  end
  local capabilities = {}
  for msgType, expected in pairs(EXPECTED) do capabilities[msgType] = expected[1] end
  local got = {}
  for msgType in pairs(types) do got[msgType] = M.REQUEST_CAPABILITY[msgType] or false end
  eq(got, capabilities, 'types and capabilities')
end)

test('every capability guards some request', function()
  local M = kit.modules(table.unpack(MODULES))
  local used = {}
  for _, capability in pairs(M.REQUEST_CAPABILITY) do used[capability] = true end
  for _, name in ipairs(M.CAPABILITIES) do truthy(used[name], name .. ' guards a request') end
end)

test('each handler module registers its own types', function()
  -- After each module from handlers on: the types of the modules loaded so far, no other.
  local loaded = {}
  for i = 1, #MODULES - 1 do
    loaded[MODULES[i]] = true
    local _, internal = kit.modules(table.unpack(MODULES, 1, i))
    if internal.closeRequests then
      local registered, expected = {}, {}
      for msgType in pairs(internal.closeRequests()) do registered[msgType] = true end
      for msgType, each in pairs(EXPECTED) do
        if loaded[each[2]] then expected[msgType] = true end
      end
      eq(registered, expected, 'registered after ' .. MODULES[i])
    end
  end
end)

test('a type registered twice is refused where the second registration is', function()
  local names = { 'core', 'consent', 'encoding', 'wire', 'loop', 'capture', 'screen', 'jobs',
    'handlers', 'exec' }
  names[#names + 1] = function(_, internal)
    internal.registerRequest('exec', nil, function() end) -- the line the error names
  end
  raises(function() kit.modules(table.unpack(names)) end,
    '^[^:]*modules/requests%.lua:%d+: request type exec registered twice$', 'a second exec')
end)

test('no type is registered once the table is made', function()
  local _, internal = kit.modules(table.unpack(MODULES))
  raises(function() internal.registerRequest('late', nil, function() end) end,
    'request type late registered after the request table was made', 'late')
end)

return kit.suite()
