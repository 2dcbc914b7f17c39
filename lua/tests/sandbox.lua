local _VERSION = '0.1.0'

--[[
Unit tests for libsandbox, with fakes for http, the event loop and os.

Run on a computer: `tests/sandbox` (finds /apis/libsandbox.lua) runs every case and prints a
summary. Loaded with the arguments `('--suite', pathToLibsandbox)` it runs nothing and returns
the suite instead: `suite.names()` lists the cases in order, `suite.run(name)` runs one and
returns `true` or `false, message`. The pytest wrapper uses that to report each case on its own.
]]

local args = { ... }

local function locateLib(path)
  if path then return dofile(path) end
  local ok, lib = pcall(require, 'libsandbox')
  if ok and type(lib) == 'table' then return lib end
  local candidates = { '/apis/libsandbox.lua', '/apis/libsandbox' }
  if shell and shell.getRunningProgram then
    local dir = fs.getDir(shell.getRunningProgram())
    table.insert(candidates, 1, fs.combine(fs.getDir(dir), 'apis/libsandbox.lua'))
  end
  for _, candidate in ipairs(candidates) do
    if fs.exists(candidate) then return dofile(candidate) end
  end
  error('libsandbox not found')
end

local lib = locateLib(args[1] == '--suite' and args[2] or nil)

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

-- Assertions ----------------------------------------------------------------

local function fmt(v)
  if type(v) == 'table' then
    local ok, s = pcall(encode, v)
    if ok then return s end
  end
  if type(v) == 'string' then return ('%q'):format(v) end
  return tostring(v)
end

local function deepEq(a, b)
  if a == b then return true end
  if type(a) ~= 'table' or type(b) ~= 'table' then return false end
  for k, v in pairs(a) do if not deepEq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

local function eq(actual, expected, what)
  if not deepEq(actual, expected) then
    error(('%s: expected %s, got %s'):format(what or 'value', fmt(expected), fmt(actual)), 2)
  end
end

local function truthy(v, what)
  if not v then error((what or 'condition') .. ' is not true', 2) end
end

local function raises(fn, pattern, what)
  local ok, err = pcall(fn)
  if ok then error((what or 'call') .. ' did not raise', 2) end
  if pattern and not tostring(err):find(pattern) then
    error(('%s raised %q, expected it to match %q'):format(what or 'call', tostring(err), pattern), 2)
  end
end

-- Fakes ---------------------------------------------------------------------

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
  local l = { handlers = {}, timers = {}, now = 0, delays = {} }
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
  function l.emit(event, ...)
    local list = l.handlers[event] or {}
    local snapshot = {}
    for i, e in ipairs(list) do snapshot[i] = e end
    for _, e in ipairs(snapshot) do e.fn(...) end
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
  local h = { sent = {}, closes = 0 }
  function h.send(text)
    if h.closes > 0 then error('attempt to use a closed file') end
    if h.failSend then error('socket broken') end
    h.sent[#h.sent + 1] = text
  end
  function h.close()
    h.closes = h.closes + 1
    if h.closes > 1 then error('closed twice') end
  end
  function h.frames()
    local out = {}
    for i, s in ipairs(h.sent) do out[i] = decode(s) end
    return out
  end
  function h.last()
    if #h.sent == 0 then return nil end
    return decode(h.sent[#h.sent])
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

-- A started session on fakes. random() returns 0 so backoff delays are exact.
local function newSession(extra)
  local env = { os = fakeOs(extra and extra.label), loop = fakeLoop(), http = fakeHttp(), state = {}, logs = {} }
  local opts = {
    url = 'ws://gw.test:4444/gateway', secret = 's3cret', http = env.http, eventLoop = env.loop,
    os = env.os, encode = encode, decode = decode, random = function() return 0 end,
    state = env.state, log = function(m) env.logs[#env.logs + 1] = m end,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  env.session = lib.startSession(opts)
  return env
end

-- Opens the current attempt and returns its handle and the hello frame sent on it.
local function open(env)
  local h = fakeHandle()
  env.loop.emit('websocket_success', env.http.lastUrl(), h)
  return h, h.last()
end

local function helloReply(hello, ok, errCode)
  local frame = { event = 'gateway_response', traposReceiverId = '7:', messageId = hello.messageId, type = 'hello', ok = ok }
  if ok then frame.payload = { accountId = 'local' } else frame.error = { code = errCode, message = 'bad secret' } end
  return encode(frame)
end

local function connected(env)
  local h, hello = open(env)
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, true), false)
  truthy(env.session.isReady(), 'session ready')
  return h, hello
end

-- Suite ---------------------------------------------------------------------

local cases, order = {}, {}
local function test(name, fn)
  if cases[name] then error('duplicate test ' .. name) end
  cases[name] = fn
  order[#order + 1] = name
end

test('traposId joins id and label', function()
  eq(lib.traposId(fakeOs('kitchen')), '7:kitchen', 'labelled')
  eq(lib.traposId(fakeOs(nil)), '7:', 'unlabelled')
  raises(function() lib.traposId('x') end, 'bad argument #1', 'traposId with a string')
end)

test('computerRequest carries the sender and coerces the payload', function()
  local f = lib.computerRequest('7:', 'm-1', 'probe_gateway', nil)
  eq(f, { event = 'computer_request', traposSenderId = '7:', messageId = 'm-1', type = 'probe_gateway', payload = {} }, 'frame')
  eq(encode(f.payload), '{}', 'empty payload encodes as an object')
  raises(function() lib.computerRequest('', 'm-1', 't') end, 'bad argument #1 %(non%-empty string', 'empty sender')
  raises(function() lib.computerRequest('7:', nil, 't') end, 'bad argument #2', 'missing messageId')
  raises(function() lib.computerRequest('7:', 'm', 't', 'x') end, 'bad argument #4 %(table or nil expected', 'string payload')
end)

test('computerResponse has payload when ok and error when not', function()
  local ok = lib.computerResponse('7:a', 'g-1', 'ping', true, { traposId = '7:a' })
  eq(ok, { event = 'computer_response', traposSenderId = '7:a', messageId = 'g-1', type = 'ping', ok = true, payload = { traposId = '7:a' } }, 'ok frame')
  local bad = lib.computerResponse('7:a', 'g-2', 'x', false, nil, { code = 'unknown_type', message = 'no' })
  eq(bad.error, { code = 'unknown_type', message = 'no' }, 'error')
  eq(bad.payload, nil, 'no payload on error')
  eq(lib.computerResponse('7:a', 'g-3', 'x', false).error.code, 'internal', 'missing error becomes internal')
  raises(function() lib.computerResponse('7:a', 'g', 'x', 'yes') end, 'bad argument #4 %(boolean expected', 'non-boolean ok')
end)

test('gateway envelopes carry the receiver', function()
  eq(lib.gatewayRequest('7:', 'u-1', 'ping', nil), { event = 'gateway_request', traposReceiverId = '7:', messageId = 'u-1', type = 'ping', payload = {} }, 'request')
  local r = lib.gatewayResponse('7:', 'u-2', 'hello', false, nil, { code = 'unauthorized', message = 'm' })
  eq(r, { event = 'gateway_response', traposReceiverId = '7:', messageId = 'u-2', type = 'hello', ok = false, error = { code = 'unauthorized', message = 'm' } }, 'response')
end)

test('hello is a computer_request with traposId secret and version', function()
  local h = lib.hello('7:lab', 'h-1', 'pw')
  eq(h.event, 'computer_request', 'event')
  eq(h.traposSenderId, '7:lab', 'sender')
  eq(h.type, 'hello', 'type')
  eq(h.payload.traposId, '7:lab', 'payload traposId')
  eq(h.payload.secret, 'pw', 'secret')
  eq(h.payload.version, lib._VERSION, 'version')
  eq(lib.hello('7:', 'h-2', nil).payload.secret, '', 'no secret sends an empty one')
  raises(function() lib.hello('', 'h') end, 'bad argument #1', 'empty sender')
end)

test('messageIds are epoch-seq and unique across callers', function()
  local o = fakeOs()
  local a, b = lib.newMessageId(o), lib.newMessageId(o)
  truthy(a:match('^%d+%-%d+$'), 'format of ' .. a)
  truthy(a ~= b, 'distinct ids')
  local seqA, seqB = tonumber(a:match('%-(%d+)$')), tonumber(b:match('%-(%d+)$'))
  eq(seqB, seqA + 1, 'sequence increments globally')
  eq(_G.traposSandboxSeq, seqB, 'sequence is kept in _G')
end)

test('withNonce appends to the query', function()
  eq(lib.withNonce('ws://h/gateway', 'x1'), 'ws://h/gateway?n=x1', 'no query')
  eq(lib.withNonce('ws://h/gateway?a=b', 'x1'), 'ws://h/gateway?a=b&n=x1', 'existing query')
end)

test('payload coercion reads non-objects as empty objects', function()
  eq(lib.coercePayload(nil), {}, 'nil')
  eq(lib.coercePayload('str'), {}, 'string')
  eq(lib.coercePayload(5), {}, 'number')
  eq(lib.coercePayload({ 1, 2 }), {}, 'list')
  local fromArray = lib.coercePayload(decode('[]'))
  eq(fromArray, {}, 'empty array')
  fromArray.x = 1 -- must be a fresh table, not the frozen empty_json_array
  eq(lib.coercePayload({ a = 1 }), { a = 1 }, 'object kept')
  eq(lib.coercePayload({ a = 1, 'mixed' }), {}, 'mixed keys')
end)

local function msgCtx()
  local ctx = { traposId = '7:t', sent = {}, queued = {}, hellos = {}, encode = encode, decode = decode }
  ctx.send = function(text) ctx.sent[#ctx.sent + 1] = decode(text); return true end
  ctx.queueEvent = function(...) ctx.queued[#ctx.queued + 1] = table.pack(...) end
  ctx.onHello = function(id, ok, payload, err) ctx.hellos[#ctx.hellos + 1] = { id = id, ok = ok, payload = payload, err = err } end
  return ctx
end

test('onMessage answers ping with traposId', function()
  local ctx = msgCtx()
  eq(lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-1', 'ping', nil)), ctx), 'ping', 'result')
  eq(#ctx.sent, 1, 'one frame sent')
  eq(ctx.sent[1], { event = 'computer_response', traposSenderId = '7:t', messageId = 'g-1', type = 'ping', ok = true, payload = { traposId = '7:t' } }, 'ping response')
  eq(#ctx.queued, 0, 'no events queued')
end)

test('onMessage answers other gateway requests with unknown_type', function()
  local ctx = msgCtx()
  eq(lib.onMessage('{"event":"gateway_request","traposReceiverId":"7:t","messageId":"g-2","type":"reboot","payload":[]}', ctx), 'unknown_type', 'result')
  eq(ctx.sent[1].ok, false, 'ok')
  eq(ctx.sent[1].type, 'reboot', 'echoes type')
  eq(ctx.sent[1].messageId, 'g-2', 'echoes messageId')
  eq(ctx.sent[1].error.code, 'unknown_type', 'code')
end)

test('onMessage dispatches gateway requests through the handler table', function()
  local ctx = msgCtx()
  local seen = {}
  ctx.handlers = {
    echo = function(req) seen[#seen + 1] = req.payload; req.respond(true, { echoed = req.payload.x }) end,
    broken = function() error('handler bug') end,
    later = function(req) ctx.pending = req end,
  }
  eq(lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-1', 'echo', { x = 5 })), ctx), 'echo', 'result')
  eq(ctx.sent[1], { event = 'computer_response', traposSenderId = '7:t', messageId = 'g-1', type = 'echo', ok = true, payload = { echoed = 5 } }, 'answer')
  lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-2', 'broken')), ctx)
  eq({ ctx.sent[2].ok, ctx.sent[2].error.code }, { false, 'internal' }, 'a raising handler answers internal')
  truthy(ctx.sent[2].error.message:find('handler bug'), 'with its message')
  lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-3', 'ping')), ctx)
  eq(ctx.sent[3].error.code, 'unknown_type', 'only the given table is used')
  lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-4', 'later')), ctx)
  eq(#ctx.sent, 3, 'no answer yet')
  eq(ctx.pending.respond(true, {}), true, 'answered later')
  eq(ctx.pending.respond(true, {}), false, 'answered once only')
  eq(#ctx.sent, 4, 'one answer')
end)

test('onMessage drives hello ok and unauthorized', function()
  local ctx = msgCtx()
  eq(lib.onMessage(encode(lib.gatewayResponse('7:t', 'h-1', 'hello', true, { accountId = 'local' })), ctx), 'hello', 'ok result')
  eq(ctx.hellos[1], { id = 'h-1', ok = true, payload = { accountId = 'local' } }, 'ok hello')
  lib.onMessage(encode(lib.gatewayResponse('7:t', 'h-2', 'hello', false, nil, { code = 'unauthorized', message = 'bad secret' })), ctx)
  eq(ctx.hellos[2], { id = 'h-2', ok = false, err = { code = 'unauthorized', message = 'bad secret' } }, 'unauthorized hello')
  eq(#ctx.queued, 0, 'hello responses queue no reply event')
end)

test('onMessage queues trapos_sandbox_reply for other responses', function()
  local ctx = msgCtx()
  local replied = {}
  ctx.onReply = function(id) replied[#replied + 1] = id end
  eq(lib.onMessage('{"event":"gateway_response","traposReceiverId":"7:t","messageId":"m-1","type":"probe_gateway","ok":true,"payload":{"sandboxOk":true,"opencodeOk":false}}', ctx), 'reply', 'result')
  local e = ctx.queued[1]
  eq({ e[1], e[2], e[3] }, { 'trapos_sandbox_reply', 'm-1', true }, 'event head')
  eq(e[4], { sandboxOk = true, opencodeOk = false }, 'payload')
  eq(e[5], nil, 'no error')
  eq(replied, { 'm-1' }, 'onReply called')
  lib.onMessage('{"event":"gateway_response","traposReceiverId":"7:t","messageId":"m-2","type":"probe_gateway","ok":false,"error":{"code":"timeout","message":"slow"}}', ctx)
  eq({ ctx.queued[2][3], ctx.queued[2][4], ctx.queued[2][5] }, { false, nil, { code = 'timeout', message = 'slow' } }, 'error reply')
end)

test('onMessage coerces array and missing payloads of replies', function()
  local ctx = msgCtx()
  lib.onMessage('{"event":"gateway_response","messageId":"m-3","type":"x","ok":true,"payload":[]}', ctx)
  lib.onMessage('{"event":"gateway_response","messageId":"m-4","type":"x","ok":true}', ctx)
  lib.onMessage('{"event":"gateway_response","messageId":"m-5","type":"x","ok":true,"payload":"str"}', ctx)
  eq(ctx.queued[1][4], {}, 'array payload')
  eq(ctx.queued[2][4], {}, 'missing payload')
  eq(ctx.queued[3][4], {}, 'string payload')
  ctx.queued[1][4].writable = true
end)

test('onMessage ignores bad frames without raising', function()
  local ctx = msgCtx()
  for _, bad in ipairs({ '', 'not json', '[1,2]', '42', '{"event":"computer_request","messageId":"a","type":"x"}',
    '{"event":"gateway_request","type":"ping"}', '{"event":"gateway_request","messageId":"a"}', '{"event":"nope","messageId":"a","type":"b"}' }) do
    eq(lib.onMessage(bad, ctx), 'ignored', 'result for ' .. bad)
  end
  eq(lib.onMessage(nil, ctx), 'ignored', 'nil content')
  eq(#ctx.sent + #ctx.queued + #ctx.hellos, 0, 'nothing happened')
end)

test('session connects with a positional websocketAsync and a nonce', function()
  local env = newSession()
  eq(#env.http.urls, 1, 'one attempt')
  truthy(env.http.urls[1]:find('^ws://gw%.test:4444/gateway%?n=.+'), 'url with nonce: ' .. env.http.urls[1])
  eq(env.session.state(), 'connecting', 'state')
  eq(env.session.isReady(), false, 'not ready')
end)

test('session sends hello on open', function()
  local env = newSession({ label = 'lab' })
  local h, hello = open(env)
  eq(#h.sent, 1, 'one frame')
  eq(hello.event, 'computer_request', 'event')
  eq(hello.type, 'hello', 'type')
  eq(hello.traposSenderId, '7:lab', 'sender')
  eq(hello.payload.traposId, '7:lab', 'payload traposId')
  eq(hello.payload.secret, 's3cret', 'secret')
  eq(env.session.state(), 'handshaking', 'state')
end)

test('session is ready on hello ack and queues connected', function()
  local env = newSession()
  connected(env)
  local e = env.os.take('trapos_sandbox_connected')
  truthy(e, 'connected event queued')
  eq(e[2], '7:', 'carries traposId')
  eq(env.session.lastError(), nil, 'no error')
  eq(env.state.connected, true, 'published connected')
  eq(env.state.traposId, '7:', 'published traposId')
  eq(env.state.url, 'ws://gw.test:4444/gateway', 'published url')
  eq(env.state.accountId, 'local', 'published accountId')
end)

test('hello ack with another messageId is ignored', function()
  local env = newSession()
  local h, hello = open(env)
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayResponse('7:', 'other', 'hello', true, {})), false)
  eq(env.session.isReady(), false, 'not ready on a foreign hello')
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, true), false)
  eq(env.session.isReady(), true, 'ready on our hello')
end)

test('unauthorized hello is terminal', function()
  local env = newSession()
  local h, hello = open(env)
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, false, 'unauthorized'), false)
  eq(env.session.state(), 'stopped', 'state')
  eq(env.session.lastError(), { code = 'unauthorized', message = 'bad secret' }, 'lastError')
  eq(h.closes, 1, 'closed once')
  -- The gateway's 4001 close follows; nothing reconnects, ever.
  env.loop.emit('websocket_closed', env.http.lastUrl(), 'unauthorized', 4001)
  env.loop.advance(120)
  eq(#env.http.urls, 1, 'no reconnect')
  eq(h.closes, 1, 'still closed once')
  eq(env.state.lastError.code, 'unauthorized', 'published error')
end)

test('send after unauthorized replies with the stored error', function()
  local env = newSession()
  local h, hello = open(env)
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, false, 'unauthorized'), false)
  env.loop.emit('trapos_sandbox_send', 'm-9', 'probe_gateway', {})
  local e = env.os.take('trapos_sandbox_reply')
  eq({ e[2], e[3], e[4] }, { 'm-9', false, nil }, 'reply head')
  eq(e[5].code, 'unauthorized', 'stored error')
  eq(#h.sent, 1, 'nothing sent after hello')
end)

test('close code 4000 replaced is terminal', function()
  local env = newSession()
  local h = connected(env)
  env.loop.emit('websocket_closed', env.http.lastUrl(), 'replaced', 4000)
  eq(env.session.state(), 'stopped', 'state')
  eq(env.session.lastError().code, 'replaced', 'lastError')
  eq(h.closes, 0, 'a closed socket is not closed again')
  env.loop.advance(300)
  eq(#env.http.urls, 1, 'no reconnect')
  env.loop.emit('trapos_sandbox_send', 'm-1', 'probe_gateway', {})
  eq(env.os.take('trapos_sandbox_reply')[5].code, 'replaced', 'send answered with replaced')
end)

test('reconnect delays double from 1 s and cap at 30 s', function()
  local env = newSession({ connectTimeout = 1000 })
  local delays = {}
  for i = 1, 8 do
    env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
    eq(env.session.state(), 'waiting', 'waiting after failure ' .. i)
    local before = #env.http.urls
    local d = env.loop.delays[#env.loop.delays]
    delays[#delays + 1] = d
    env.loop.advance(d - 0.01)
    eq(#env.http.urls, before, 'not yet reconnected ' .. i)
    env.loop.advance(0.01)
    eq(#env.http.urls, before + 1, 'reconnected ' .. i)
  end
  eq(delays, { 1, 2, 4, 8, 16, 30, 30, 30 }, 'delays')
end)

test('reconnect delays have jitter below the base', function()
  local env = newSession({ random = function() return 0.5 end, connectTimeout = 1000 })
  env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
  local d1 = env.loop.delays[#env.loop.delays]
  env.loop.advance(d1)
  env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
  local d2 = env.loop.delays[#env.loop.delays]
  eq(d1, 0.9, 'first delay with jitter')
  eq(d2, 1.8, 'second delay with jitter')
end)

test('a drop after ready reconnects and resets the backoff', function()
  local env = newSession({ connectTimeout = 1000 })
  env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
  env.loop.advance(1)
  env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
  env.loop.advance(2)
  local h = connected(env)
  env.loop.emit('websocket_closed', env.http.lastUrl())
  eq(env.session.state(), 'waiting', 'waiting')
  eq(env.session.lastError().code, 'not_connected', 'error recorded')
  eq(env.loop.delays[#env.loop.delays], 1, 'backoff restarts at 1 s')
  eq(h.closes, 0, 'remote close is not closed again')
  env.loop.advance(1)
  eq(#env.http.urls, 4, 'reconnected')
  connected(env)
  eq(env.os.count('trapos_sandbox_connected'), 2, 'connected queued each time')
end)

test('hello timeout closes and reconnects', function()
  local env = newSession()
  local h = open(env)
  env.loop.advance(9.9)
  eq(h.closes, 0, 'still waiting at 9.9 s')
  env.loop.advance(0.1)
  eq(h.closes, 1, 'closed at 10 s')
  eq(env.session.lastError().code, 'timeout', 'timeout recorded')
  eq(env.session.state(), 'waiting', 'waiting')
  env.loop.advance(1)
  eq(#env.http.urls, 2, 'reconnected')
  -- CraftOS-PC queues websocket_closed for the local close later: ignored.
  env.loop.emit('websocket_closed', env.http.urls[1], nil, 1006)
  eq(env.session.state(), 'connecting', 'stale close ignored')
  eq(h.closes, 1, 'closed once')
end)

test('each attempt uses a fresh nonce', function()
  local env = newSession({ connectTimeout = 1000 })
  for _ = 1, 4 do
    env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
    env.loop.advance(60)
  end
  local seen = {}
  for _, u in ipairs(env.http.urls) do
    truthy(not seen[u], 'url reused: ' .. u)
    seen[u] = true
  end
  eq(#env.http.urls, 5, 'attempts')
end)

test('stale events of an old attempt are ignored', function()
  local env = newSession({ connectTimeout = 1000 })
  local oldUrl = env.http.lastUrl()
  local oldHandle, oldHello = open(env)
  env.loop.emit('websocket_closed', oldUrl)
  env.loop.advance(1)
  local newUrl = env.http.lastUrl()
  truthy(newUrl ~= oldUrl, 'new url')
  local h, hello = open(env)
  -- A late hello ack, message and close of the old attempt change nothing.
  env.loop.emit('websocket_message', oldUrl, helloReply(oldHello, true), false)
  eq(env.session.isReady(), false, 'old hello ack ignored')
  env.loop.emit('websocket_message', oldUrl, encode(lib.gatewayRequest('7:', 'g', 'ping')), false)
  eq(#oldHandle.sent, 1, 'no ping answer on the old handle')
  eq(#h.sent, 1, 'no ping answer on the new handle')
  env.loop.emit('websocket_closed', oldUrl, 'bye', 1000)
  env.loop.emit('websocket_failure', oldUrl, 'late')
  eq(env.session.state(), 'handshaking', 'still handshaking')
  env.loop.emit('websocket_message', newUrl, helloReply(hello, true), false)
  eq(env.session.isReady(), true, 'ready on the current attempt')
  eq(#env.http.urls, 2, 'no extra attempt')
end)

test('a late success of an abandoned attempt is closed', function()
  local env = newSession({ connectTimeout = 5 })
  local oldUrl = env.http.lastUrl()
  env.loop.advance(5)
  eq(env.session.state(), 'waiting', 'connect timed out')
  env.loop.advance(1)
  local late = fakeHandle()
  env.loop.emit('websocket_success', oldUrl, late)
  eq(late.closes, 1, 'late handle closed')
  eq(#late.sent, 0, 'no hello on the late handle')
  eq(env.session.state(), 'connecting', 'current attempt untouched')
end)

test('send while not connected is answered at once with not_connected', function()
  local env = newSession()
  env.loop.emit('trapos_sandbox_send', 'm-1', 'probe_gateway', {})
  local e = env.os.take('trapos_sandbox_reply')
  truthy(e, 'reply queued')
  eq({ e[2], e[3], e[4] }, { 'm-1', false, nil }, 'reply head')
  eq(e[5].code, 'not_connected', 'code')
  local h = open(env)
  env.loop.emit('trapos_sandbox_send', 'm-2', 'probe_gateway', {})
  eq(env.os.take('trapos_sandbox_reply')[5].code, 'not_connected', 'still not connected while handshaking')
  eq(#h.sent, 1, 'only hello sent')
end)

test('send when ready forwards a computer_request', function()
  local env = newSession()
  local h = connected(env)
  env.loop.emit('trapos_sandbox_send', 'm-3', 'probe_gateway', { a = 1 })
  eq(h.last(), { event = 'computer_request', traposSenderId = '7:', messageId = 'm-3', type = 'probe_gateway', payload = { a = 1 } }, 'frame')
  env.loop.emit('trapos_sandbox_send', 'm-4', 'probe_gateway', nil)
  eq(h.sent[#h.sent], encode({ event = 'computer_request', traposSenderId = '7:', messageId = 'm-4', type = 'probe_gateway', payload = {} }), 'empty payload as {}')
  eq(env.os.count('trapos_sandbox_reply'), 0, 'no local reply')
end)

test('pending sends fail with not_connected when the connection drops', function()
  local env = newSession()
  local h = connected(env)
  env.loop.emit('trapos_sandbox_send', 'm-5', 'probe_gateway', {})
  env.loop.emit('trapos_sandbox_send', 'm-6', 'probe_gateway', {})
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayResponse('7:', 'm-5', 'probe_gateway', true, { sandboxOk = true })), false)
  eq(env.os.take('trapos_sandbox_reply')[2], 'm-5', 'answered one')
  env.loop.emit('websocket_closed', env.http.lastUrl())
  local e = env.os.take('trapos_sandbox_reply')
  eq({ e[2], e[3], e[5].code }, { 'm-6', false, 'not_connected' }, 'pending failed')
  eq(env.os.take('trapos_sandbox_reply'), nil, 'nothing else')
end)

test('a failing send is caught and reconnects', function()
  local env = newSession()
  local h = connected(env)
  h.failSend = true
  env.loop.emit('trapos_sandbox_send', 'm-7', 'probe_gateway', {})
  local e = env.os.take('trapos_sandbox_reply')
  eq({ e[2], e[3], e[5].code }, { 'm-7', false, 'not_connected' }, 'reply')
  eq(h.closes, 1, 'closed')
  eq(env.session.state(), 'waiting', 'waiting to reconnect')
end)

test('session answers gateway ping and unknown requests', function()
  local env = newSession({ label = 'p' })
  local h = connected(env)
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayRequest('7:p', 'g-1', 'ping')), false)
  eq(h.last(), { event = 'computer_response', traposSenderId = '7:p', messageId = 'g-1', type = 'ping', ok = true, payload = { traposId = '7:p' } }, 'ping')
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayRequest('7:p', 'g-2', 'shutdown')), false)
  eq(h.last().error.code, 'unknown_type', 'unknown type')
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayRequest('7:p', 'g-3', 'ping')), true)
  eq(#h.sent, 3, 'binary frames ignored')
end)

test('a handle is never closed twice and empty strings never sent', function()
  local env = newSession({ encode = function(v) if v.type == 'hello' then return '' end return encode(v) end })
  local h = open(env)
  eq(#h.sent, 0, 'empty hello not sent')
  eq(h.closes, 1, 'closed once')
  env.loop.emit('websocket_closed', env.http.urls[1], nil, 1006)
  env.session.stop()
  eq(h.closes, 1, 'still once after close event and stop')
end)

test('stop disposes handlers and timers', function()
  local env = newSession()
  local h = connected(env)
  env.session.stop()
  eq(h.closes, 1, 'closed')
  eq(env.session.isReady(), false, 'not ready')
  eq(env.state.running, false, 'published not running')
  env.loop.emit('trapos_sandbox_send', 'm-8', 'probe_gateway', {})
  eq(env.os.count('trapos_sandbox_reply'), 0, 'no handler left')
  env.loop.advance(100)
  eq(#env.http.urls, 1, 'no reconnect')
end)

test('handlers accept loops that pass the event name', function()
  local loop = fakeLoop()
  local namedLoop = {
    setTimeout = loop.setTimeout,
    register = function(event, handler)
      return loop.register(event, function(...) handler(event, ...) end)
    end,
  }
  local env = newSession({ eventLoop = namedLoop })
  env.loop = loop
  local h, hello = open(env)
  eq(hello.type, 'hello', 'hello sent')
  loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, true), false)
  eq(env.session.isReady(), true, 'ready')
end)

test('websocketAsync raising or refusing schedules a reconnect', function()
  local httpApi = { calls = 0 }
  function httpApi.websocketAsync(url)
    httpApi.calls = httpApi.calls + 1
    if httpApi.calls == 1 then error('Websocket connections are disabled') end
    return false, 'too many websockets'
  end
  local env = newSession({ http = httpApi })
  eq(env.session.state(), 'waiting', 'waiting after a raise')
  eq(env.session.lastError().code, 'not_connected', 'error')
  env.loop.advance(1)
  eq(httpApi.calls, 2, 'retried')
  eq(env.session.state(), 'waiting', 'waiting after a refusal')
  truthy(env.session.lastError().message:find('too many websockets'), 'refusal message kept')
end)

test('createEventLoop dispatches events and timers', function()
  local started, cancelled = {}, {}
  local o = {
    startTimer = function(s) started[#started + 1] = s; return #started end,
    cancelTimer = function(id) cancelled[#cancelled + 1] = id end,
  }
  local loop = lib.createEventLoop(o)
  local seen = {}
  local dispose = loop.register('x', function(a, b) seen[#seen + 1] = a .. b end)
  local fired = 0
  loop.setTimeout(function() fired = fired + 1 end, 2)
  local clear = loop.setTimeout(function() fired = fired + 10 end, 3)
  loop.dispatch('x', 'a', 'b')
  loop.dispatch('timer', 1)
  loop.dispatch('timer', 1)
  clear()
  loop.dispatch('timer', 2)
  dispose()
  loop.dispatch('x', 'c', 'd')
  eq(seen, { 'ab' }, 'handler calls')
  eq(fired, 1, 'timer fired once, cleared one never')
  eq(started, { 2, 3 }, 'timers started')
  eq(cancelled, { 2 }, 'cleared timer cancelled')
end)

-- request() with scripted event primitives.
local function scriptedEvents(script)
  local p = { queued = {}, timers = {}, cancelled = {} }
  p.queueEvent = function(...) p.queued[#p.queued + 1] = table.pack(...) end
  p.startTimer = function(s) p.timers[#p.timers + 1] = s; return 100 + #p.timers end
  p.cancelTimer = function(id) p.cancelled[#p.cancelled + 1] = id end
  p.pullEvent = function()
    local nextEvent = table.remove(script, 1)
    if not nextEvent then error('script exhausted') end
    if type(nextEvent) == 'function' then nextEvent = nextEvent(p) end
    return table.unpack(nextEvent, 1, nextEvent.n or #nextEvent)
  end
  p.os = fakeOs()
  return p
end

test('request resolves with the matching reply', function()
  local p
  p = scriptedEvents({
    function(s) return { 'trapos_sandbox_reply', 'someone-else', true, { wrong = true }, n = 5 } end,
    { 'timer', 999 },
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], true, { sandboxOk = true }, n = 5 } end,
  })
  local ok, payload = lib.request('probe_gateway', nil, p)
  eq(ok, true, 'ok')
  eq(payload, { sandboxOk = true }, 'payload')
  local sent = p.queued[1]
  eq({ sent[1], sent[3] }, { 'trapos_sandbox_send', 'probe_gateway' }, 'send event')
  truthy(sent[2]:match('^%d+%-%d+$'), 'messageId format')
  eq(sent[4], {}, 'payload coerced')
  eq(p.timers, { 10 }, 'default timeout 10 s')
  eq(p.cancelled, { 101 }, 'timer cancelled')
end)

test('request returns the error of a failed reply', function()
  local p = scriptedEvents({
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], false, nil, { code = 'unauthorized', message = 'bad secret' }, n = 5 } end,
  })
  local ok, err = lib.request('probe_gateway', {}, p)
  eq(ok, false, 'ok')
  eq(err, { code = 'unauthorized', message = 'bad secret' }, 'error')
end)

test('request times out on its own timer', function()
  local p = scriptedEvents({ { 'timer', 555 }, { 'timer', 101 } })
  p.timeout = 3
  local ok, err = lib.request('probe_gateway', {}, p)
  eq(ok, false, 'ok')
  eq(err.code, 'timeout', 'code')
  eq(p.timers, { 3 }, 'custom timeout')
end)

-- A tiny bus between a session and a requester: queued events reach the session's handlers
-- and the requester's pullEvent. `whenEmpty()` may emit more before the requester would block.
local function requestThrough(env, whenEmpty)
  local inbox = {}
  local function bus(...)
    inbox[#inbox + 1] = table.pack(...)
    env.loop.emit(...)
  end
  env.os.queueEvent = bus
  return lib.request('probe_gateway', {}, {
    os = env.os, queueEvent = bus, startTimer = function() return 1 end, cancelTimer = function() end,
    pullEvent = function()
      if not inbox[1] and whenEmpty then whenEmpty() end
      local e = table.remove(inbox, 1)
      if not e then error('nothing queued') end
      return table.unpack(e, 1, e.n)
    end,
  })
end

test('request gets not_connected from a session that is not ready', function()
  local ok, err = requestThrough(newSession())
  eq(ok, false, 'ok')
  eq(err.code, 'not_connected', 'code')
end)

test('request round-trips through a ready session', function()
  local env = newSession()
  local h = connected(env)
  local ok, payload = requestThrough(env, function()
    -- The gateway answers what was sent.
    local frame = h.last()
    local answer = lib.gatewayResponse('7:', frame.messageId, frame.type, true, { sandboxOk = true, opencodeOk = false })
    env.loop.emit('websocket_message', env.http.lastUrl(), encode(answer), false)
  end)
  eq(ok, true, 'ok')
  eq(payload, { sandboxOk = true, opencodeOk = false }, 'payload')
end)

local suite = {}
function suite.names()
  local out = {}
  for i, n in ipairs(order) do out[i] = n end
  return out
end
function suite.run(name)
  local fn = cases[name]
  if not fn then return false, 'no such test: ' .. tostring(name) end
  local ok, err = pcall(fn)
  if ok then return true end
  return false, tostring(err)
end

if args[1] == '--suite' then return suite end

local passed, failed = 0, 0
for _, name in ipairs(order) do
  local ok, err = suite.run(name)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    print('FAIL ' .. name .. ': ' .. err)
  end
end
print(('sandbox tests: %d passed, %d failed'):format(passed, failed))
if failed > 0 then error('tests failed', 0) end
