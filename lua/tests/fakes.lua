local _VERSION = '0.1.0'

--[[
Fakes of CraftOS shared by tests/sandbox.lua and the module tests (tests/modules/). Returns:
  encode, decode, EMPTY_ARRAY  a tiny JSON codec, so the tests need no textutils
  os(label)                    computer 7, a fixed clock, queued events recorded in order
  loop()                       an event loop with virtual time (emit, advance, pending)
  handle()                     a websocket handle recording what is sent (frames, last)
  http()                       http.websocketAsync recording the URLs and headers
  fs(capacity)                 an in-memory fs with a read-only /rom, a capacity counted like
                               CC:Tweaked's (500 bytes at least per file or folder), binary
                               handles and CraftOS's error messages; f.files[path] and
                               f.dirs[path] (paths without a leading /) are its content
]]

-- A tiny JSON codec for the tests, so they do not need textutils. Empty tables encode as {},
-- like CC:Tweaked; `[]` decodes to a distinct frozen table, like textutils.empty_json_array.
local EMPTY_ARRAY = setmetatable({}, { __newindex = function() error('attempt to mutate empty_json_array', 2) end })

local function encode(value)
  local t = type(value)
  if t == 'nil' then return 'null'
  elseif t == 'boolean' or t == 'number' then return tostring(value)
  elseif t == 'string' then
    return '"' .. value:gsub('[%c"\\]', function(c)
      return ('\\u%04x'):format(c:byte())
    end) .. '"'
  elseif t == 'table' then
    if value == EMPTY_ARRAY then return '[]' end
    if next(value) == nil then return '{}' end
    if value[1] ~= nil then
      local parts = {}
      for i = 1, #value do parts[i] = encode(value[i]) end
      return '[' .. table.concat(parts, ',') .. ']'
    end
    local keys = {}
    for k in pairs(value) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do parts[i] = encode(k) .. ':' .. encode(value[k]) end
    return '{' .. table.concat(parts, ',') .. '}'
  end
  error('cannot encode ' .. t)
end

local function decode(text)
  local pos = 1
  local function ws() pos = text:find('[^ \t\r\n]', pos) or #text + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = text:sub(pos, pos)
      if c == '' then error('unterminated string') end
      if c == '"' then pos = pos + 1; break end
      if c == '\\' then
        local e = text:sub(pos + 1, pos + 1)
        if e == 'u' then
          out[#out + 1] = string.char(tonumber(text:sub(pos + 2, pos + 5), 16) % 256)
          pos = pos + 6
        else
          local map = { n = '\n', t = '\t', r = '\r', b = '\b', f = '\f' }
          out[#out + 1] = map[e] or e
          pos = pos + 2
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
    return table.concat(out)
  end
  function value()
    ws()
    local c = text:sub(pos, pos)
    if c == '{' then
      local obj = {}
      pos = pos + 1; ws()
      if text:sub(pos, pos) == '}' then pos = pos + 1; return obj end
      while true do
        ws()
        local k = str(); ws()
        if text:sub(pos, pos) ~= ':' then error('expected :') end
        pos = pos + 1
        obj[k] = value(); ws()
        local d = text:sub(pos, pos); pos = pos + 1
        if d == '}' then return obj end
        if d ~= ',' then error('expected , or }') end
      end
    elseif c == '[' then
      local arr = {}
      pos = pos + 1; ws()
      if text:sub(pos, pos) == ']' then pos = pos + 1; return EMPTY_ARRAY end
      while true do
        arr[#arr + 1] = value(); ws()
        local d = text:sub(pos, pos); pos = pos + 1
        if d == ']' then return arr end
        if d ~= ',' then error('expected , or ]') end
      end
    elseif c == '"' then return str()
    elseif text:sub(pos, pos + 3) == 'true' then pos = pos + 4; return true
    elseif text:sub(pos, pos + 4) == 'false' then pos = pos + 5; return false
    elseif text:sub(pos, pos + 3) == 'null' then pos = pos + 4; return nil
    end
    local num = text:match('^-?%d+%.?%d*[eE]?[+-]?%d*', pos)
    if not num or num == '' then error('unexpected character at ' .. pos) end
    pos = pos + #num
    return tonumber(num)
  end
  local result = value()
  ws()
  if pos <= #text then error('trailing characters') end
  return result
end

-- os: computer 7 (label optional), a fixed clock, queued events recorded in order.
local function fakeOs(label)
  local o = { queued = {}, now = 1700000000000 }
  function o.getComputerID() return 7 end
  function o.getComputerLabel() return label end
  function o.epoch(kind)
    if kind ~= 'utc' then error('epoch must be asked for utc time') end
    o.now = o.now + 1
    return o.now
  end
  function o.queueEvent(...)
    o.queued[#o.queued + 1] = table.pack(...)
  end
  function o.take(name)
    for i, e in ipairs(o.queued) do
      if e[1] == name then return table.remove(o.queued, i) end
    end
  end
  function o.count(name)
    local n = 0
    for _, e in ipairs(o.queued) do if e[1] == name then n = n + 1 end end
    return n
  end
  return o
end

-- Event loop with virtual time. Handlers get the event's parameters without its name.
local function fakeLoop()
  local l = { handlers = {}, any = {}, timers = {}, now = 0, delays = {} }
  function l.register(event, handler)
    l.handlers[event] = l.handlers[event] or {}
    local entry = { fn = handler }
    table.insert(l.handlers[event], entry)
    return function()
      for i, e in ipairs(l.handlers[event]) do
        if e == entry then table.remove(l.handlers[event], i); return end
      end
    end
  end
  function l.setTimeout(fn, seconds)
    local t = { fn = fn, at = l.now + seconds, seconds = seconds }
    table.insert(l.timers, t)
    table.insert(l.delays, seconds)
    return function() t.cleared = true end
  end
  function l.registerAny(handler)
    local entry = { fn = handler }
    table.insert(l.any, entry)
    return function()
      for i, e in ipairs(l.any) do
        if e == entry then table.remove(l.any, i); return end
      end
    end
  end
  function l.emit(event, ...)
    local list = l.handlers[event] or {}
    local snapshot = {}
    for i, e in ipairs(list) do snapshot[i] = e end
    for _, e in ipairs(snapshot) do e.fn(...) end
    local anySnapshot = {}
    for i, e in ipairs(l.any) do anySnapshot[i] = e end
    for _, e in ipairs(anySnapshot) do e.fn(event, ...) end
  end
  function l.advance(seconds)
    local target = l.now + seconds
    while true do
      local nextTimer
      for _, t in ipairs(l.timers) do
        if not t.cleared and not t.fired and t.at <= target and (not nextTimer or t.at < nextTimer.at) then
          nextTimer = t
        end
      end
      if not nextTimer then break end
      l.now = nextTimer.at
      nextTimer.fired = true
      nextTimer.fn()
    end
    l.now = target
  end
  function l.pending()
    local n = 0
    for _, t in ipairs(l.timers) do if not t.cleared and not t.fired then n = n + 1 end end
    return n
  end
  return l
end

local function fakeHandle()
  local h = { sent = {}, binary = {}, closes = 0 }
  function h.send(text, binary)
    if h.closes > 0 then error('attempt to use a closed file') end
    if h.failSend then error('socket broken') end
    h.sent[#h.sent + 1] = text
    h.binary[#h.sent] = binary == true
  end
  -- A binary message is a file part: its frame, then a newline and its bytes (`raw`).
  local function frameOf(i)
    local text = h.sent[i]
    if not h.binary[i] then return decode(text) end
    local newline = text:find('\n', 1, true)
    local frame = decode(text:sub(1, newline - 1))
    frame.raw = text:sub(newline + 1)
    return frame
  end
  function h.close()
    h.closes = h.closes + 1
    if h.closes > 1 then error('closed twice') end
  end
  function h.frames()
    local out = {}
    for i in ipairs(h.sent) do out[i] = frameOf(i) end
    return out
  end
  function h.last()
    if #h.sent == 0 then return nil end
    return frameOf(#h.sent)
  end
  return h
end

local function fakeHttp()
  local f = { urls = {}, headers = {} }
  function f.websocketAsync(url, headers)
    if type(url) ~= 'string' then error('bad argument #1 (string expected)') end
    f.urls[#f.urls + 1] = url
    f.headers[#f.headers + 1] = headers
    return true
  end
  function f.lastUrl() return f.urls[#f.urls] end
  return f
end

-- An in-memory fs (see above).
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

return {
  EMPTY_ARRAY = EMPTY_ARRAY, encode = encode, decode = decode,
  os = fakeOs, loop = fakeLoop, handle = fakeHandle, http = fakeHttp, fs = fakeFs,
}
