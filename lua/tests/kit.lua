local _VERSION = '0.1.0'

--[[
The kit of the module tests (tests/modules/NAME.lua, one file per module of lua/sandbox/): cases,
assertions, and the modules under test loaded alone, without the rest of libsandbox.

  local kit = dofile('tests/kit.lua')(loadModule, fakes)
      loadModule(name) -> that module's chunk; fakes: tests/fakes.lua's table (kit.fakes)
  kit.test(name, fn)              a case; kit.onCleanup(fn) undoes what a case changed in _G
  kit.eq(actual, expected, what)  deep equality; kit.truthy(v, what); kit.raises(fn, pattern, what)
  kit.modules('core', 'wire')     -> M, internal: fresh tables, those modules run in that order
                                  (a function in the list runs there as a module would)
  kit.suite()                     -> { names(), run(name) -> true | false, message }

The pytest wrapper (tests/lua/test_lua_unit.py) gives loadModule reading lua/sandbox/NAME.lua
under the chunk name @sandbox/NAME.lua, as the one-file build does, and runs each case in a
fresh Lua 5.2 with CC:Tweaked's cc.expect on package.path.
]]

return function(loadModule, fakes)
  local kit = { fakes = fakes }

  function kit.modules(...)
    local M, internal = {}, {}
    for _, name in ipairs({ ... }) do
      local chunk = type(name) == 'function' and name or loadModule(name)
      chunk(M, internal)
    end
    return M, internal
  end

  local function deepEq(a, b)
    if a == b then return true end
    if type(a) ~= 'table' or type(b) ~= 'table' then return false end
    for k, v in pairs(a) do
      if not deepEq(v, b[k]) then return false end
    end
    for k in pairs(b) do
      if a[k] == nil then return false end
    end
    return true
  end

  local function show(value, depth)
    depth = depth or 0
    if type(value) == 'string' then return ('%q'):format(value) end
    if type(value) ~= 'table' or depth > 3 then return tostring(value) end
    local keys = {}
    for k in pairs(value) do keys[#keys + 1] = k end
    table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
    local parts = {}
    for i, k in ipairs(keys) do parts[i] = tostring(k) .. '=' .. show(value[k], depth + 1) end
    return '{' .. table.concat(parts, ', ') .. '}'
  end

  function kit.eq(actual, expected, what)
    if not deepEq(actual, expected) then
      error(('%s: expected %s, got %s'):format(what or 'value', show(expected), show(actual)), 2)
    end
  end

  function kit.truthy(value, what)
    if not value then error((what or 'condition') .. ' is not true', 2) end
  end

  function kit.raises(fn, pattern, what)
    local ok, err = pcall(fn)
    if ok then error((what or 'call') .. ' did not raise', 2) end
    if pattern and not tostring(err):find(pattern) then
      error(('%s raised %q, expected it to match %q'):format(what or 'call', tostring(err), pattern), 2)
    end
  end

  local cleanups = {}
  function kit.onCleanup(fn) cleanups[#cleanups + 1] = fn end

  local cases, order = {}, {}
  function kit.test(name, fn)
    if cases[name] then error('duplicate test ' .. name, 2) end
    cases[name] = fn
    order[#order + 1] = name
  end

  function kit.suite()
    local suite = {}
    function suite.names()
      local names = {}
      for i, name in ipairs(order) do names[i] = name end
      return names
    end
    function suite.run(name)
      local fn = cases[name]
      if not fn then return false, 'no test ' .. tostring(name) end
      local ok, err = pcall(fn)
      for i = #cleanups, 1, -1 do pcall(cleanups[i]) end
      cleanups = {}
      if ok then return true end
      return false, tostring(err)
    end
    return suite
  end

  return kit
end
