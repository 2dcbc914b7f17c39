local _VERSION = '0.1.0'

--[[
libsandbox as the trapsandbox data pack carries it: this loader is
rom/modules/main/libsandbox.lua (`require('libsandbox')`), and libsandbox's modules are the files
beside it, rom/modules/main/sandbox/NAME.lua, as they are in the source (lua/sandbox/). It runs
them as the one-file build (/apis/libsandbox.lua: `wget run`, the installer, trapos) does: each
in order, loaded under the chunk name @sandbox/NAME.lua, so that an error or a traceback names
the module and its line, and run as chunk(M, internal). sandbox/core.lua says what libsandbox is
and what each module owns.

The modules are read from the folder `require` found this file in (it passes the path
package.searchpath gave, after the name). Loaded some other way (dofile, or a require that passes
no path), they are where package.searchpath finds sandbox.core on package.path, else in
/rom/modules/main.
]]

-- The modules in the order they run: written here when the data pack is built, from
-- trapsandbox.web.client.MODULES.
local MODULES = {}

local _, found = ...

local function folder()
  if type(found) == 'string' then return fs.getDir(found) end
  local core = type(package) == 'table' and type(package.searchpath) == 'function'
    and package.searchpath('sandbox.core', package.path)
  if type(core) == 'string' then return fs.getDir(fs.getDir(core)) end
  return '/rom/modules/main'
end

local function source(dir, name)
  local path = fs.combine(fs.combine(dir, 'sandbox'), name .. '.lua')
  local file = fs.open(path, 'r')
  if not file then error('libsandbox: no module /' .. path, 0) end
  local text = file.readAll()
  file.close()
  return text
end

local M, internal = {}, {}
local dir = folder()
for _, name in ipairs(MODULES) do
  local chunk, err = load(source(dir, name), '@sandbox/' .. name .. '.lua', 't', _ENV)
  if not chunk then error(err, 0) end
  chunk(M, internal)
end
return M
