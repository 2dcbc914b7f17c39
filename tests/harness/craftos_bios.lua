-- The CraftOS emulation used by tests/harness/craftos.py. Runs inside a lupa Lua 5.2 runtime whose
-- strings are bytes on both sides. `host` holds the Python callbacks (I/O, timers, sockets);
-- everything CraftOS programs see (os, fs, term, settings, textutils, http, parallel, shell,
-- multishell) is built here. Returns the kernel table Python drives.
local host, computerOptions = ...

local kernel = {}
local nativeLoad, nativePcall = load, pcall
local tableUnpack, tablePack = table.unpack, table.pack

-- Remove what CraftOS does not have, or what would reach the host machine.
io, require, package, loadstring, unpack, setfenv, getfenv, module = nil, nil, nil, nil, nil, nil, nil, nil
collectgarbage = nil
dofile, loadfile = nil, nil

local function expect(n, value, ...)
  local t = type(value)
  for i = 1, select('#', ...) do
    if t == select(i, ...) then return value end
  end
  error(('bad argument #%d (expected %s, got %s)'):format(n, table.concat({ ... }, ' or '), t), 3)
end

-- Event queue and processes ---------------------------------------------------

local QUEUE_LIMIT = 256
local queue = {}
local procs = {}
local current = nil
local nextPid = 0
kernel.dropped = 0

function kernel.enqueue(...)
  if #queue >= QUEUE_LIMIT then
    kernel.dropped = kernel.dropped + 1
    return false
  end
  queue[#queue + 1] = tablePack(...)
  host.wake()
  return true
end

local function finish(p, ok, err)
  p.dead = true
  for i = #procs, 1, -1 do
    if procs[i] == p then table.remove(procs, i) end
  end
  host.procDone(p.pid, ok, err and tostring(err) or nil)
end

local function resume(p, ...)
  local previous = current
  current = p
  local ok, result = coroutine.resume(p.co, ...)
  current = previous
  if not ok then
    finish(p, false, result)
  elseif coroutine.status(p.co) == 'dead' then
    finish(p, true, nil)
  else
    p.filter = result
  end
end

function kernel.spawn(fn, name)
  nextPid = nextPid + 1
  local p = { pid = nextPid, name = name or ('process ' .. nextPid), co = coroutine.create(fn) }
  procs[#procs + 1] = p
  resume(p)
  return p.pid
end

function kernel.step()
  local event = table.remove(queue, 1)
  if not event then return false end
  local snapshot = {}
  for i = 1, #procs do snapshot[i] = procs[i] end
  for _, p in ipairs(snapshot) do
    if not p.dead and (p.filter == nil or p.filter == event[1] or event[1] == 'terminate') then
      resume(p, tableUnpack(event, 1, event.n))
    end
  end
  return #queue > 0
end

function kernel.processCount() return #procs end
function kernel.queueLength() return #queue end
function kernel.killAll()
  for _, p in ipairs(procs) do p.dead = true end
  procs = {}
  queue = {}
end

-- Terminal ------------------------------------------------------------------

local function out(text) host.out(text) end

function write(text)
  text = tostring(text)
  out(text)
  local lines = 0
  for _ in text:gmatch('\n') do lines = lines + 1 end
  return lines
end

function print(...)
  local n = select('#', ...)
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  return write(table.concat(parts, '\t') .. '\n')
end

function printError(...)
  local n = select('#', ...)
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  host.err(table.concat(parts, '\t') .. '\n')
end

local cursorX, cursorY = 1, 1
term = {}
function term.write(text) out(tostring(text)) end
function term.blit(text) out(tostring(text)) end
function term.clear() end
function term.clearLine() end
function term.getCursorPos() return cursorX, cursorY end
function term.setCursorPos(x, y) cursorX, cursorY = x, y end
function term.setCursorBlink() end
function term.getCursorBlink() return false end
function term.getSize() return 51, 19 end
function term.scroll() end
function term.isColor() return true end
term.isColour = term.isColor
function term.setTextColor() end
term.setTextColour = term.setTextColor
function term.setBackgroundColor() end
term.setBackgroundColour = term.setBackgroundColor
function term.getTextColor() return 1 end
term.getTextColour = term.getTextColor
function term.getBackgroundColor() return 32768 end
term.getBackgroundColour = term.getBackgroundColor
function term.current() return term end
function term.native() return term end
function term.redirect(t) return term end

colors = { white = 1, orange = 2, magenta = 4, lightBlue = 8, yellow = 16, lime = 32, pink = 64,
  gray = 128, lightGray = 256, cyan = 512, purple = 1024, blue = 2048, brown = 4096,
  green = 8192, red = 16384, black = 32768 }
colours = colors
keys = { enter = 257, backspace = 259, tab = 258, up = 265, down = 264, left = 263, right = 262 }
function keys.getName(code)
  for k, v in pairs(keys) do if v == code then return k end end
end

-- os ------------------------------------------------------------------------

local nativeOs = os
os = {}
os.time = function(kind)
  if kind == nil or kind == 'ingame' then return host.ingameTime() end
  return nativeOs.time()
end
os.date = nativeOs.date
os.day = function() return 1 end
function os.epoch(kind)
  kind = kind or 'ingame'
  return host.epoch(kind)
end
function os.clock() return host.clock() end
function os.getComputerID() return computerOptions.id end
os.computerID = os.getComputerID
function os.getComputerLabel() return computerOptions.label end
os.computerLabel = os.getComputerLabel
function os.setComputerLabel(label)
  expect(1, label, 'string', 'nil')
  computerOptions.label = label
  host.setLabel(label)
end
function os.version() return 'CraftOS 1.9' end
function os.queueEvent(name, ...)
  expect(1, name, 'string')
  kernel.enqueue(name, ...)
end
function os.startTimer(seconds)
  expect(1, seconds, 'number')
  return host.startTimer(seconds)
end
function os.cancelTimer(id)
  expect(1, id, 'number')
  host.cancelTimer(id)
end
function os.setAlarm() error('os.setAlarm is not emulated', 2) end
function os.pullEventRaw(filter)
  return coroutine.yield(filter)
end
function os.pullEvent(filter)
  local event = tablePack(coroutine.yield(filter))
  if event[1] == 'terminate' then error('Terminated', 0) end
  return tableUnpack(event, 1, event.n)
end
function os.sleep(seconds)
  local id = os.startTimer(seconds or 0)
  repeat
    local _, timer = os.pullEvent('timer')
  until timer == id
end
sleep = os.sleep
function os.shutdown()
  host.shutdown()
  while true do coroutine.yield('__never__') end
end
function os.reboot() os.shutdown() end

-- fs ------------------------------------------------------------------------

fs = {}
local function normalise(path)
  local parts = {}
  for seg in tostring(path):gsub('\\', '/'):gmatch('[^/]+') do
    if seg == '..' then
      if #parts > 0 then table.remove(parts) end
    elseif seg ~= '.' then
      parts[#parts + 1] = seg
    end
  end
  return table.concat(parts, '/')
end
function fs.combine(...)
  local parts = {}
  for i = 1, select('#', ...) do
    local p = select(i, ...)
    expect(i, p, 'string')
    parts[#parts + 1] = p
  end
  return normalise(table.concat(parts, '/'))
end
function fs.getName(path)
  local p = normalise(path)
  if p == '' then return 'root' end
  return p:match('([^/]+)$')
end
function fs.getDir(path)
  local p = normalise(path)
  if p == '' then return '..' end
  return p:match('^(.*)/[^/]+$') or ''
end
function fs.exists(path) expect(1, path, 'string'); return host.fsExists(normalise(path)) end
function fs.isDir(path) expect(1, path, 'string'); return host.fsIsDir(normalise(path)) end
function fs.isReadOnly(path) expect(1, path, 'string'); return normalise(path):sub(1, 3) == 'rom' end
function fs.getSize(path) return host.fsSize(normalise(path)) end
function fs.getFreeSpace() return 1000000 end
function fs.getDrive(path) return normalise(path):sub(1, 3) == 'rom' and 'rom' or 'hdd' end
function fs.list(path)
  expect(1, path, 'string')
  local names = host.fsList(normalise(path))
  if not names then error('/' .. normalise(path) .. ': Not a directory', 2) end
  local out = {}
  for i = 1, #names do out[i] = names[i] end
  table.sort(out)
  return out
end
local function writable(path)
  if normalise(path):sub(1, 3) == 'rom' then error('/' .. normalise(path) .. ': Access denied', 3) end
end
function fs.makeDir(path) writable(path); host.fsMakeDir(normalise(path)) end
function fs.delete(path) writable(path); host.fsDelete(normalise(path)) end
function fs.move(from, to) writable(from); writable(to); host.fsMove(normalise(from), normalise(to)) end
function fs.copy(from, to) writable(to); host.fsCopy(normalise(from), normalise(to)) end
function fs.find(pattern)
  local result = {}
  local p = normalise(pattern)
  if host.fsExists(p) then result[1] = p end
  return result
end
function fs.open(path, mode)
  expect(1, path, 'string')
  expect(2, mode, 'string')
  local p = normalise(path)
  if mode == 'r' or mode == 'rb' then
    local content = host.fsRead(p)
    if content == nil then return nil, '/' .. p .. ': No such file' end
    local pos = 1
    local h = {}
    function h.readAll()
      local rest = content:sub(pos)
      pos = #content + 1
      return rest
    end
    function h.readLine(withTrailing)
      if pos > #content then return nil end
      local s, e = content:find('\n', pos, true)
      local line
      if s then
        line = content:sub(pos, withTrailing and e or s - 1)
        pos = e + 1
      else
        line = content:sub(pos)
        pos = #content + 1
      end
      return line
    end
    function h.read(count)
      if pos > #content then return nil end
      count = count or 1
      local s = content:sub(pos, pos + count - 1)
      pos = pos + count
      return s
    end
    function h.close() end
    return h
  elseif mode == 'w' or mode == 'wb' or mode == 'a' or mode == 'ab' then
    if p:sub(1, 3) == 'rom' then return nil, '/' .. p .. ': Access denied' end
    if host.fsIsDir(p) then return nil, '/' .. p .. ': Cannot write to directory' end
    local append = mode:sub(1, 1) == 'a'
    if not append then host.fsWrite(p, '', false) end
    local buffer = {}
    local closed = false
    local h = {}
    local function flush()
      if #buffer > 0 then
        host.fsWrite(p, table.concat(buffer), true)
        buffer = {}
      end
    end
    function h.write(s)
      if closed then error('attempt to use a closed file', 2) end
      buffer[#buffer + 1] = type(s) == 'number' and tostring(s) or s
    end
    function h.writeLine(s) h.write(tostring(s) .. '\n') end
    function h.flush() flush() end
    function h.close()
      if closed then error('attempt to use a closed file', 2) end
      flush()
      closed = true
    end
    if append and not host.fsExists(p) then host.fsWrite(p, '', false) end
    return h
  end
  error('Unsupported mode ' .. mode, 2)
end

-- Loading code from the virtual filesystem.
function loadfile(path, env)
  local h = fs.open(path, 'r')
  if not h then return nil, 'File not found' end
  local content = h.readAll()
  h.close()
  return nativeLoad(content, '@/' .. normalise(path), 't', env or _G)
end
function dofile(path)
  local fn, err = loadfile(path, _G)
  if not fn then error(err, 2) end
  return fn()
end
function load(chunk, name, mode, env)
  return nativeLoad(chunk, name, mode, env or _G)
end

-- textutils -----------------------------------------------------------------

textutils = {}
local function frozen(str, name)
  return setmetatable({}, {
    __newindex = function() error('attempt to mutate textutils.' .. name, 2) end,
    __tostring = function() return str end,
  })
end
textutils.empty_json_array = frozen('[]', 'empty_json_array')
textutils.json_null = frozen('null', 'json_null')

local jsonEscapes = {}
for i = 0, 255 do
  local c = string.char(i)
  if i < 32 or i >= 127 then jsonEscapes[c] = ('\\u00%02X'):format(i) end
end
jsonEscapes['"'] = '\\"'
jsonEscapes['\\'] = '\\\\'
jsonEscapes['\b'] = '\\b'
jsonEscapes['\f'] = '\\f'
jsonEscapes['\n'] = '\\n'
jsonEscapes['\r'] = '\\r'
jsonEscapes['\t'] = '\\t'

local function jsonString(s)
  return '"' .. s:gsub('[\0-\31"\\\127-\255]', jsonEscapes) .. '"'
end

local function toJson(value, seen)
  local t = type(value)
  if value == textutils.empty_json_array then return '[]' end
  if value == textutils.json_null then return 'null' end
  if t == 'string' then return jsonString(value) end
  if t == 'number' or t == 'boolean' then return tostring(value) end
  if t ~= 'table' then error('Cannot serialize type ' .. t, 0) end
  if seen[value] then error('Cannot serialize table with recursive entries', 0) end
  seen[value] = true
  local result
  if next(value) == nil then
    result = '{}'
  else
    local objectParts, largest = {}, 0
    for k, v in pairs(value) do
      if type(k) == 'string' then
        objectParts[#objectParts + 1] = jsonString(k) .. ':' .. toJson(v, seen)
      elseif type(k) == 'number' and k > largest then
        largest = k
      end
    end
    if #objectParts > 0 or largest == 0 then
      result = '{' .. table.concat(objectParts, ',') .. '}'
    else
      local arrayParts = {}
      for i = 1, largest do
        arrayParts[i] = value[i] == nil and 'null' or toJson(value[i], seen)
      end
      result = '[' .. table.concat(arrayParts, ',') .. ']'
    end
  end
  seen[value] = nil
  return result
end

function textutils.serializeJSON(value, options)
  expect(1, value, 'table', 'string', 'number', 'boolean')
  return toJson(value, {})
end
textutils.serialiseJSON = textutils.serializeJSON

local function utf8Char(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then
    return string.char(0xC0 + math.floor(code / 64), 0x80 + code % 64)
  end
  return string.char(0xE0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
end

local JsonError = {}
local function jsonFail(pos, msg) error(setmetatable({ pos = pos, msg = msg }, JsonError), 0) end

local function skipWs(s, pos)
  local _, last = s:find('^[ \n\r\t]+', pos)
  return last and last + 1 or pos
end

local simpleEscapes = { b = '\b', f = '\f', n = '\n', r = '\r', t = '\t', ['"'] = '"', ['/'] = '/', ['\\'] = '\\' }

local function parseString(s, pos)
  local buf = {}
  while true do
    local c = s:sub(pos, pos)
    if c == '' then jsonFail(pos, "Unexpected end of input, expected '\"'.") end
    if c == '"' then return table.concat(buf), pos + 1 end
    if c == '\\' then
      local e = s:sub(pos + 1, pos + 1)
      if e == 'u' then
        local hex = s:match('^%x%x%x%x', pos + 2)
        if not hex then jsonFail(pos, 'Malformed unicode escape.') end
        buf[#buf + 1] = utf8Char(tonumber(hex, 16))
        pos = pos + 6
      elseif simpleEscapes[e] then
        buf[#buf + 1] = simpleEscapes[e]
        pos = pos + 2
      else
        jsonFail(pos + 1, ('Unknown escape character %q.'):format(e))
      end
    elseif c < ' ' then
      jsonFail(pos, ('Unescaped whitespace %q.'):format(c))
    else
      local _, finish = s:find('^[^"\\%c]+', pos)
      finish = finish or pos
      buf[#buf + 1] = s:sub(pos, finish)
      pos = finish + 1
    end
  end
end

local parseValue
function parseValue(s, pos, opts)
  pos = skipWs(s, pos)
  local c = s:sub(pos, pos)
  if c == '"' then return parseString(s, pos + 1) end
  if c == '{' then
    local obj = {}
    pos = skipWs(s, pos + 1)
    if s:sub(pos, pos) == '}' then return obj, pos + 1 end
    while true do
      if s:sub(pos, pos) ~= '"' then jsonFail(pos, 'Unexpected character, expected object key.') end
      local key
      key, pos = parseString(s, pos + 1)
      pos = skipWs(s, pos)
      if s:sub(pos, pos) ~= ':' then jsonFail(pos, "Unexpected character, expected ':'.") end
      local value
      value, pos = parseValue(s, pos + 1, opts)
      obj[key] = value
      pos = skipWs(s, pos)
      local d = s:sub(pos, pos)
      if d == '}' then return obj, pos + 1 end
      if d ~= ',' then jsonFail(pos, "Unexpected character, expected ',' or '}'.") end
      pos = skipWs(s, pos + 1)
    end
  end
  if c == '[' then
    local arr, n = {}, 0
    pos = skipWs(s, pos + 1)
    if s:sub(pos, pos) == ']' then
      if opts.parse_empty_array == false then return {}, pos + 1 end
      return textutils.empty_json_array, pos + 1
    end
    while true do
      local value
      value, pos = parseValue(s, pos, opts)
      n = n + 1
      arr[n] = value
      pos = skipWs(s, pos)
      local d = s:sub(pos, pos)
      if d == ']' then return arr, pos + 1 end
      if d ~= ',' then jsonFail(pos, "Unexpected character, expected ',' or ']'.") end
      pos = pos + 1
    end
  end
  if s:sub(pos, pos + 3) == 'true' then return true, pos + 4 end
  if s:sub(pos, pos + 4) == 'false' then return false, pos + 5 end
  if s:sub(pos, pos + 3) == 'null' then
    if opts.parse_null then return textutils.json_null, pos + 4 end
    return nil, pos + 4
  end
  if c == '-' or c:match('%d') then
    local _, last, num = s:find('^(-?%d+%.?%d*[eE]?[+-]?%d*)', pos)
    local value = tonumber(num)
    if not value then jsonFail(pos, 'Malformed number.') end
    return value, last + 1
  end
  if c == '' then jsonFail(pos, 'Unexpected end of input.') end
  jsonFail(pos, ('Unexpected character %q.'):format(c))
end

function textutils.unserializeJSON(s, options)
  expect(1, s, 'string')
  expect(2, options, 'table', 'nil')
  local ok, value, pos = nativePcall(parseValue, s, 1, options or {})
  if not ok then
    if getmetatable(value) == JsonError then
      return nil, ('Malformed JSON at position %d: %s'):format(value.pos, value.msg)
    end
    error(value, 0)
  end
  pos = skipWs(s, pos)
  if pos <= #s then
    return nil, ('Malformed JSON at position %d: Unexpected trailing character.'):format(pos)
  end
  return value
end
textutils.unserialiseJSON = textutils.unserializeJSON

local function serialize(value, indent)
  local t = type(value)
  if t == 'string' then return ('%q'):format(value) end
  if t == 'number' or t == 'boolean' or t == 'nil' then return tostring(value) end
  if t ~= 'table' then error('Cannot serialize type ' .. t, 0) end
  local parts = {}
  local keys = {}
  for k in pairs(value) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local key = type(k) == 'string' and k:match('^[%a_][%w_]*$') and k or ('[' .. serialize(k, '') .. ']')
    parts[#parts + 1] = indent .. '  ' .. key .. ' = ' .. serialize(value[k], indent .. '  ') .. ','
  end
  if #parts == 0 then return '{}' end
  return '{\n' .. table.concat(parts, '\n') .. '\n' .. indent .. '}'
end
function textutils.serialize(value) return serialize(value, '') end
textutils.serialise = textutils.serialize
function textutils.unserialize(s)
  expect(1, s, 'string')
  local fn = nativeLoad('return ' .. s, 'unserialize', 't', {})
  if not fn then return nil end
  local ok, value = nativePcall(fn)
  if ok then return value end
  return nil
end
textutils.unserialise = textutils.unserialize
function textutils.urlEncode(s)
  return (s:gsub('[^%w%-_%.~]', function(c) return ('%%%02X'):format(c:byte()) end))
end

-- settings ------------------------------------------------------------------

settings = {}
local settingValues, settingDetails = {}, {}
function settings.define(name, options)
  expect(1, name, 'string')
  expect(2, options, 'table', 'nil')
  settingDetails[name] = options or {}
end
function settings.undefine(name) settingDetails[name] = nil end
function settings.set(name, value)
  expect(1, name, 'string')
  local d = settingDetails[name]
  if d and d.type and type(value) ~= d.type then
    error(('bad argument #2 (expected %s, got %s)'):format(d.type, type(value)), 2)
  end
  settingValues[name] = value
end
function settings.get(name, default)
  expect(1, name, 'string')
  local v = settingValues[name]
  if v ~= nil then return v end
  if default ~= nil then return default end
  local d = settingDetails[name]
  return d and d.default
end
function settings.getDetails(name)
  local d = settingDetails[name] or {}
  return { description = d.description, default = d.default, type = d.type, value = settingValues[name] }
end
function settings.unset(name) settingValues[name] = nil end
function settings.clear() settingValues = {} end
function settings.getNames()
  local names = {}
  for k in pairs(settingValues) do names[#names + 1] = k end
  for k in pairs(settingDetails) do if settingValues[k] == nil then names[#names + 1] = k end end
  table.sort(names)
  return names
end
function settings.load(path)
  local h = fs.open(path or '.settings', 'r')
  if not h then return false end
  local values = textutils.unserialize(h.readAll())
  h.close()
  if type(values) ~= 'table' then return false end
  for k, v in pairs(values) do settingValues[k] = v end
  return true
end
function settings.save(path)
  local h = fs.open(path or '.settings', 'w')
  if not h then return false end
  h.write(textutils.serialize(settingValues))
  h.close()
  return true
end
settings.load('.settings')

-- parallel --------------------------------------------------------------------

parallel = {}
local function runRoutines(fns, limit)
  local routines, filters = {}, {}
  local alive = #fns
  for i, fn in ipairs(fns) do routines[i] = coroutine.create(fn) end
  local event = { n = 0 }
  while true do
    for i = 1, #routines do
      local co = routines[i]
      if co and (filters[i] == nil or filters[i] == event[1] or event[1] == 'terminate') then
        local ok, result = coroutine.resume(co, tableUnpack(event, 1, event.n))
        if not ok then error(result, 0) end
        filters[i] = result
        if coroutine.status(co) == 'dead' then
          routines[i] = false
          alive = alive - 1
          if alive <= limit then return i end
        end
      end
    end
    event = tablePack(coroutine.yield())
  end
end
function parallel.waitForAny(...) return runRoutines({ ... }, #{ ... } - 1) end
function parallel.waitForAll(...) runRoutines({ ... }, 0) end

-- http ------------------------------------------------------------------------

local function makeResponse(code, body, headers)
  local pos = 1
  local h = {}
  function h.getResponseCode() return code end
  function h.getResponseHeaders() return headers or {} end
  function h.readAll()
    local rest = body:sub(pos)
    pos = #body + 1
    return rest
  end
  function h.readLine()
    if pos > #body then return nil end
    local s, e = body:find('\n', pos, true)
    local line
    if s then line = body:sub(pos, s - 1); pos = e + 1 else line = body:sub(pos); pos = #body + 1 end
    return line
  end
  function h.close() end
  return h
end
kernel.makeResponse = makeResponse

local function makeWebsocket(sid, url)
  local closed = false
  local h = {}
  function h.send(message, binary)
    if closed then error('attempt to use a closed file', 2) end
    expect(1, message, 'string')
    local ok, err = host.wsSend(sid, message, binary and true or false)
    if not ok then error(err, 2) end
  end
  function h.receive(timeout)
    if closed then error('attempt to use a closed file', 2) end
    local timer = timeout and os.startTimer(timeout)
    while true do
      local event, a, b, c = os.pullEvent()
      if event == 'websocket_message' and a == url then return b, c end
      if event == 'websocket_closed' and a == url then return nil end
      if event == 'timer' and a == timer then return nil end
    end
  end
  function h.close()
    host.wsClose(sid, closed)
    closed = true
  end
  return h
end
kernel.makeWebsocket = makeWebsocket

if computerOptions.http then
  http = {}
  local function requestArgs(url, body, headers, binary)
    if type(url) == 'table' then
      return url.url, url.body, url.headers, url.binary, url.method
    end
    return url, body, headers, binary, nil
  end
  function http.request(...)
    local url, body, headers, _, method = requestArgs(...)
    expect(1, url, 'string')
    local ok, err = host.httpRequest(url, method or (body and 'POST' or 'GET'), body, headers)
    if not ok then
      os.queueEvent('http_failure', url, err)
      return false, err
    end
    return true
  end
  local function blocking(url, body, headers, binary, method)
    local ok, err = http.request({ url = url, body = body, headers = headers, binary = binary, method = method })
    if not ok then return nil, err end
    while true do
      local event, u, a, b = os.pullEvent()
      if event == 'http_success' and u == url then return a end
      if event == 'http_failure' and u == url then return nil, a, b end
    end
  end
  function http.get(...)
    local url, _, headers, binary, method = requestArgs(...)
    expect(1, url, 'string')
    return blocking(url, nil, headers, binary, method or 'GET')
  end
  function http.post(...)
    local url, body, headers, binary, method = requestArgs(...)
    return blocking(url, body, headers, binary, method or 'POST')
  end
  function http.checkURL(url) return type(url) == 'string' and url:find('^https?://') ~= nil end
  function http.websocketAsync(url, headers)
    expect(1, url, 'string')
    expect(2, headers, 'table', 'nil')
    local ok, err = host.wsOpen(url, headers)
    if not ok then
      os.queueEvent('websocket_failure', url, err)
      return false, err
    end
    return true
  end
  function http.websocket(url, headers)
    local ok, err = http.websocketAsync(url, headers)
    if not ok then return false, err end
    while true do
      local event, u, a = os.pullEvent()
      if event == 'websocket_success' and u == url then return a end
      if event == 'websocket_failure' and u == url then return false, a end
    end
  end
end

-- shell, multishell, programs -------------------------------------------------

local aliases = {}
local shellPath = '.:/rom/programs:/rom/programs/http'
local multishellApi

local function makeRequire(env, programPath)
  local loaded = {}
  local dir = fs.getDir(programPath or '')
  local function findModule(name)
    local rel = name:gsub('%.', '/')
    for _, pattern in ipairs({ '?.lua', '?/init.lua', '/rom/modules/main/?.lua' }) do
      local candidate = pattern:gsub('%?', rel)
      if candidate:sub(1, 1) ~= '/' then candidate = fs.combine(dir, candidate) end
      if fs.exists(candidate) and not fs.isDir(candidate) then return candidate end
    end
  end
  local package = { loaded = loaded, path = '?;?.lua;?/init.lua;/rom/modules/main/?.lua' }
  local function requireFn(name)
    expect(1, name, 'string')
    if loaded[name] ~= nil then return loaded[name] end
    local path = findModule(name)
    if not path then error(("module '%s' not found"):format(name), 2) end
    local fn, err = loadfile(path, env)
    if not fn then error(err, 2) end
    local result = fn(name, path)
    if result == nil then result = true end
    loaded[name] = result
    return result
  end
  return requireFn, package
end

local newShell

local function tokenise(...)
  local line = table.concat({ ... }, ' ')
  local words, quoted = {}, false
  for match in (line .. '"'):gmatch('(.-)"') do
    if quoted then
      words[#words + 1] = match
    else
      for word in match:gmatch('[^ \t]+') do words[#words + 1] = word end
    end
    quoted = not quoted
  end
  return words
end

local function makeEnv(shellObj, path)
  local env = setmetatable({}, { __index = _G })
  env.shell = shellObj
  env.multishell = multishellApi
  env.require, env.package = makeRequire(env, path)
  return env
end

function os.run(env, path, ...)
  expect(1, env, 'table')
  expect(2, path, 'string')
  if getmetatable(env) == nil then setmetatable(env, { __index = _G }) end
  local fn, err = loadfile(path, env)
  if not fn then
    printError(err)
    return false
  end
  local args = tablePack(...)
  local ok, runErr = pcall(fn, tableUnpack(args, 1, args.n))
  if not ok then
    if runErr and runErr ~= '' then printError(runErr) end
    return false
  end
  return true
end

function os.loadAPI(path)
  local name = fs.getName(path):gsub('%.lua$', '')
  local env = setmetatable({}, { __index = _G })
  local fn, err = loadfile(path, env)
  if not fn then printError(err) return false end
  local ok, runErr = pcall(fn)
  if not ok then printError(runErr) return false end
  local api = {}
  for k, v in pairs(env) do api[k] = v end
  _G[name] = api
  return true
end

function newShell()
  local sh = {}
  local dir = ''
  local running = {}
  function sh.dir() return dir end
  function sh.setDir(d) dir = normalise(d) end
  function sh.path() return shellPath end
  function sh.setPath(p) shellPath = p end
  function sh.aliases()
    local copy = {}
    for k, v in pairs(aliases) do copy[k] = v end
    return copy
  end
  function sh.setAlias(name, program) aliases[name] = program end
  function sh.clearAlias(name) aliases[name] = nil end
  function sh.resolve(p)
    if p:sub(1, 1) == '/' or p:sub(1, 1) == '\\' then return normalise(p) end
    return fs.combine(dir, p)
  end
  function sh.resolveProgram(name)
    name = aliases[name] or name
    local function found(p)
      if fs.exists(p) and not fs.isDir(p) then return p end
      if fs.exists(p .. '.lua') and not fs.isDir(p .. '.lua') then return p .. '.lua' end
    end
    if name:find('/', 1, true) or name:find('\\', 1, true) then
      return found(sh.resolve(name))
    end
    for entry in shellPath:gmatch('[^:]+') do
      local base = entry == '.' and dir or normalise(entry)
      local p = found(fs.combine(base, name))
      if p then return p end
    end
  end
  function sh.getRunningProgram() return running[#running] end
  function sh.execute(command, ...)
    local path = sh.resolveProgram(command)
    if not path then
      printError('No such program')
      return false
    end
    running[#running + 1] = path
    local env = makeEnv(sh, path)
    env.arg = { [0] = command, ... }
    local ok = os.run(env, path, ...)
    running[#running] = nil
    return ok
  end
  function sh.run(...)
    local words = tokenise(...)
    if #words == 0 then return false end
    return sh.execute(tableUnpack(words))
  end
  function sh.exit() end
  if multishellApi then
    function sh.openTab(...)
      local args = tablePack(...)
      local child = newShell()
      return kernel.spawn(function() child.run(tableUnpack(args, 1, args.n)) end, table.concat(args, ' '))
    end
    function sh.switchTab() end
  end
  return sh
end

if computerOptions.multishell then
  multishellApi = {}
  local titles = {}
  function multishellApi.getCurrent() return current and current.pid or 1 end
  function multishellApi.getCount() return #procs end
  function multishellApi.setTitle(id, title) titles[id] = title end
  function multishellApi.getTitle(id) return titles[id] end
  function multishellApi.setFocus() return true end
  function multishellApi.getFocus() return multishellApi.getCurrent() end
  function multishellApi.launch(env, path, ...)
    local args = tablePack(...)
    return kernel.spawn(function() os.run(env, path, tableUnpack(args, 1, args.n)) end, path)
  end
  multishell = multishellApi
end

function read(replaceChar)
  local buffer = ''
  while true do
    local event, a = os.pullEvent()
    if event == 'paste' or event == 'char' then
      buffer = buffer .. a
    elseif event == 'key' and a == keys.enter then
      if replaceChar then
        print(string.rep(replaceChar:sub(1, 1), #buffer))
      else
        print(buffer)
      end
      return buffer
    elseif event == 'key' and a == keys.backspace then
      buffer = buffer:sub(1, -2)
    end
  end
end

-- Kernel entry points used by Python ------------------------------------------

function kernel.runCommand(line)
  local sh = newShell()
  return kernel.spawn(function() sh.run(line) end, line)
end

function kernel.runLua(code, name)
  local fn, err = nativeLoad(code, '=' .. (name or 'harness'), 't', makeEnv(newShell(), nil))
  if not fn then error(err, 0) end
  return kernel.spawn(fn, name)
end

function kernel.boot()
  local sh = newShell()
  return kernel.spawn(function()
    if fs.exists('/startup.lua') then sh.run('/startup.lua') end
    if fs.isDir('/startup') then
      for _, name in ipairs(fs.list('/startup')) do sh.run('/' .. fs.combine('startup', name)) end
    end
  end, 'startup')
end

function kernel.eval(code)
  local fn, err = nativeLoad(code, '=eval', 't', _G)
  if not fn then error(err, 0) end
  return fn()
end

return kernel
