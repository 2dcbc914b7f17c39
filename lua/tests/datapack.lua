local _VERSION = '0.1.0'

--[[
Unit tests for the data pack's libsandbox (datapack/libsandbox.lua, as the pack carries it: the
modules' names written in), the loader of the modules the pack puts beside it, on a fake fs.

  dofile('tests/datapack.lua')(kit, loader, modules, sourceOf)
      kit: tests/kit.lua's; loader: the loader's source as served; modules: the names it lists,
      in order; sourceOf(name) -> lua/sandbox/NAME.lua's source
]]

local kit, loader, modules, sourceOf = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

-- A fake fs holding `files` (path -> source), made the global fs until the case ends.
local function withFs(files)
  local fsApi = kit.fakes.fs()
  for path, text in pairs(files) do fsApi.put(path, text) end
  local saved = rawget(_G, 'fs')
  kit.onCleanup(function() rawset(_G, 'fs', saved) end)
  rawset(_G, 'fs', fsApi)
  return fsApi
end

-- Every module's real source under `dir`, `changed` (name -> source) instead of some.
local function moduleFiles(dir, changed)
  local files = {}
  for _, name in ipairs(modules) do
    files[dir .. '/sandbox/' .. name .. '.lua'] = (changed or {})[name] or sourceOf(name)
  end
  return files
end

-- The loader run as CC:Tweaked's require runs a module: given its name and the path it found.
local function required(path)
  local chunk = assert(load(loader, '@libsandbox.lua'))
  return chunk('libsandbox', path)
end

test('it runs every module from the folder it was found in, in order, as one library', function()
  local stubs = {}
  for _, name in ipairs(modules) do
    stubs[name] = 'local M, internal = ...\n'
      .. 'internal.order = internal.order or {}\n'
      .. 'internal.order[#internal.order + 1] = "' .. name .. '"\n'
      .. 'M.internal = internal\n'
  end
  withFs(moduleFiles('packs/x', stubs))
  local M = required('/packs/x/libsandbox.lua')
  eq(M.internal.order, modules, 'each module once, in order, sharing M and internal')
end)

test('the real modules loaded from the ROM make the library the one-file build makes', function()
  local fsApi = withFs(moduleFiles('rom/modules/main'))
  local M = required('/rom/modules/main/libsandbox.lua')
  eq(M._VERSION, _VERSION, 'version')
  eq(type(M.onMessage), 'function', 'onMessage')
  eq(type(M.requestHandlers.ping), 'function', 'the request table')
  eq(fsApi.opens, #modules, 'one read per module')
  eq(fsApi.closes, #modules, 'each file closed')
end)

test('an error in a module names the module and its line', function()
  withFs(moduleFiles('rom/modules/main', { files = 'local M = ...\n\nerror("broken")\n' }))
  raises(function() required('/rom/modules/main/libsandbox.lua') end,
    '^sandbox/files%.lua:3: broken$', 'raised while it runs')
  withFs(moduleFiles('rom/modules/main', { wire = 'local M = ...\nlocal = 1\n' }))
  raises(function() required('/rom/modules/main/libsandbox.lua') end,
    '^sandbox/wire%.lua:2: ', 'does not compile')
end)

test('a function of a module names the module and its line in a traceback', function()
  withFs(moduleFiles('rom/modules/main'))
  local M = required('/rom/modules/main/libsandbox.lua')
  local _, trace = xpcall(function() return M.isSettingsPath(nil) end, debug.traceback)
  truthy(tostring(trace):find('^sandbox/handlers%.lua:%d+: '), tostring(trace))
  truthy(tostring(trace):find('\n%s*sandbox/handlers%.lua:%d+: in function'), tostring(trace))
end)

test('a module missing from the folder is named', function()
  local files = moduleFiles('rom/modules/main')
  files['rom/modules/main/sandbox/jobs.lua'] = nil
  withFs(files)
  raises(function() required('/rom/modules/main/libsandbox.lua') end,
    '^libsandbox: no module /rom/modules/main/sandbox/jobs%.lua$', 'jobs')
end)

test('loaded without a path it looks where package.searchpath finds the modules', function()
  withFs(moduleFiles('lib'))
  local savedPackage = package
  kit.onCleanup(function() rawset(_G, 'package', savedPackage) end)
  local asked
  rawset(_G, 'package', {
    path = '/lib/?.lua',
    searchpath = function(name, path) asked = { name, path } return '/lib/sandbox/core.lua' end,
  })
  local chunk = assert(load(loader, '@libsandbox.lua'))
  eq(type(chunk().onMessage), 'function', 'loaded')
  eq(asked, { 'sandbox.core', '/lib/?.lua' }, 'searched package.path')
  rawset(_G, 'package', nil)
  withFs(moduleFiles('rom/modules/main'))
  eq(type(chunk().onMessage), 'function', 'no package: the ROM\'s folder')
end)

return kit.suite()
