local _VERSION = '0.1.0'

--[[
Fakes of CraftOS shared by tests/sandbox.lua and the module tests (tests/modules/): returns
{ fs = fakeFs }. fakeFs(capacity): an in-memory fs with a read-only /rom, a capacity counted
like CC:Tweaked's (500 bytes at least per file or folder), binary handles and CraftOS's error
messages; f.files[path] and f.dirs[path] (paths without a leading /) are its content.
]]

local function fakeFs(capacity)
  local f = { files = {}, dirs = { [''] = true }, capacity = capacity or 1000000, closes = 0, opens = 0 }
  local function norm(path)
    local parts = {}
    for seg in tostring(path):gsub('\\', '/'):gmatch('[^/]+') do
      if seg == '..' then table.remove(parts) elseif seg ~= '.' then parts[#parts + 1] = seg end
    end
    return table.concat(parts, '/')
  end
  local function readOnly(p) return p == 'rom' or p:sub(1, 4) == 'rom/' end
  local function denied(p) if readOnly(p) then error('/' .. p .. ': Access denied', 0) end end
  local function under(p, q) return q:sub(1, #p + 1) == p .. '/' end
  function f.combine(...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = select(i, ...) end
    return norm(table.concat(parts, '/'))
  end
  function f.getDir(p) p = norm(p); if p == '' then return '..' end return p:match('^(.*)/[^/]+$') or '' end
  function f.getName(p) p = norm(p); if p == '' then return 'root' end return p:match('([^/]+)$') end
  function f.exists(p) p = norm(p); return f.files[p] ~= nil or f.dirs[p] == true end
  function f.isDir(p) return f.dirs[norm(p)] == true end
  function f.isReadOnly(p) return readOnly(norm(p)) end
  function f.getSize(p)
    p = norm(p)
    if f.files[p] then return #f.files[p] end
    if f.dirs[p] then return 0 end
    error('/' .. p .. ': No such file', 0)
  end
  function f.used()
    local n = 0
    for p, c in pairs(f.files) do if not readOnly(p) then n = n + math.max(500, #c) end end
    for d in pairs(f.dirs) do if d ~= '' and not readOnly(d) then n = n + 500 end end
    return n
  end
  function f.getFreeSpace(p)
    p = norm(p)
    if not f.exists(p) then error('/' .. p .. ': No such file', 0) end
    if readOnly(p) then return 0 end
    return f.capacity - f.used()
  end
  function f.makeDir(p)
    p = norm(p)
    denied(p)
    if f.files[p] then error('/' .. p .. ': File exists', 0) end
    local acc = {}
    for seg in p:gmatch('[^/]+') do
      acc[#acc + 1] = seg
      f.dirs[table.concat(acc, '/')] = true
    end
  end
  function f.list(p)
    p = norm(p)
    if not f.dirs[p] then error('/' .. p .. ': Not a directory', 0) end
    local out, seen = {}, {}
    local function add(q)
      local rest = p == '' and q or (under(p, q) and q:sub(#p + 2))
      if rest and rest ~= '' and not rest:find('/') and not seen[rest] then seen[rest] = true; out[#out + 1] = rest end
    end
    for q in pairs(f.files) do add(q) end
    for q in pairs(f.dirs) do add(q) end
    table.sort(out)
    return out
  end
  function f.delete(p)
    p = norm(p)
    denied(p)
    f.files[p] = nil
    f.dirs[p] = nil
    for q in pairs(f.files) do if under(p, q) then f.files[q] = nil end end
    for q in pairs(f.dirs) do if under(p, q) then f.dirs[q] = nil end end
  end
  function f.move(a, b)
    a, b = norm(a), norm(b)
    denied(a); denied(b)
    if not f.exists(a) then error('/' .. a .. ': No such file', 0) end
    if f.exists(b) then error('/' .. b .. ': File exists', 0) end
    if under(a, b) then error("Can't move a directory inside itself", 0) end
    if f.dirs[a] then
      local moves = {}
      for q in pairs(f.files) do if under(a, q) then moves[#moves + 1] = { 'files', q } end end
      for q in pairs(f.dirs) do if under(a, q) then moves[#moves + 1] = { 'dirs', q } end end
      for _, m in ipairs(moves) do
        local kind, q = m[1], m[2]
        f[kind][b .. q:sub(#a + 1)], f[kind][q] = f[kind][q], nil
      end
      f.dirs[b], f.dirs[a] = true, nil
      return
    end
    f.files[b], f.files[a] = f.files[a], nil
  end
  function f.open(p, mode)
    p = norm(p)
    if mode == 'r' or mode == 'rb' then
      local content = f.files[p]
      if not content then return nil, '/' .. p .. ': No such file' end
      f.opens = f.opens + 1
      local pos, closed = 1, false
      local h = {}
      local function check() if closed then error('attempt to use a closed file', 0) end end
      function h.read(n)
        check()
        if pos > #content then return nil end
        local s = content:sub(pos, pos + (n or 1) - 1)
        pos = pos + #s
        return s
      end
      function h.readAll() check(); local s = content:sub(pos); pos = #content + 1; return s end
      function h.seek(whence, offset) check(); if whence == 'set' then pos = offset + 1 end; return pos - 1 end
      function h.close() check(); closed = true; f.closes = f.closes + 1 end
      return h
    end
    if mode == 'w' or mode == 'wb' or mode == 'a' or mode == 'ab' then
      if readOnly(p) then return nil, '/' .. p .. ': Access denied' end
      if f.dirs[p] then return nil, '/' .. p .. ': Cannot write to directory' end
      if not f.dirs[f.getDir(p)] then return nil, '/' .. p .. ': No such file' end
      f.opens = f.opens + 1
      local append = mode:sub(1, 1) == 'a'
      f.files[p] = append and (f.files[p] or '') or ''
      local closed = false
      local h = {}
      function h.write(s)
        if closed then error('attempt to use a closed file', 0) end
        local grown = f.files[p] .. s
        if f.used() - math.max(500, #f.files[p]) + math.max(500, #grown) > f.capacity then error('Out of space', 0) end
        f.files[p] = grown
      end
      function h.close()
        if closed then error('attempt to use a closed file', 0) end
        closed = true
        f.closes = f.closes + 1
      end
      return h
    end
    error('Unsupported mode', 2)
  end
  function f.put(p, content)
    p = norm(p)
    local dir = f.getDir(p)
    if dir ~= '' then
      local acc = {}
      for seg in dir:gmatch('[^/]+') do acc[#acc + 1] = seg; f.dirs[table.concat(acc, '/')] = true end
    end
    f.files[p] = content
  end
  return f
end

return { fs = fakeFs }
