local _VERSION = '0.1.0'

--[[
Unit tests for libsandbox, with fakes for http, the event loop and os.

Run on a computer: `tests/sandbox` (finds /apis/libsandbox.lua, and tests/fakes.lua beside
itself) runs every case and prints a summary. Loaded with the arguments
`('--suite', libsandbox, fakes)` (libsandbox's path or compiled chunk; tests/fakes.lua's table)
it runs nothing and returns the suite instead: `suite.names()` lists the cases in order,
`suite.run(name)` runs one and returns `true` or `false, message`. The pytest wrapper uses that
to report each case on its own.
]]

local args = { ... }

local function locateLib(path)
  if type(path) == 'function' then return path() end
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

-- tests/fakes.lua: given by the pytest wrapper, else beside this file.
local function locateFakes(given)
  if type(given) == 'table' then return given end
  return dofile(fs.combine(fs.getDir(shell.getRunningProgram()), 'fakes.lua'))
end
local fakes = locateFakes(args[1] == '--suite' and args[3] or nil)

-- tests/fakes.lua: the JSON codec and the fakes of CraftOS (os, event loop, websocket, http).
local EMPTY_ARRAY, encode, decode = fakes.EMPTY_ARRAY, fakes.encode, fakes.decode
local fakeOs, fakeLoop, fakeHandle, fakeHttp = fakes.os, fakes.loop, fakes.handle, fakes.http

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

-- A started session on fakes. random() returns 0 so backoff delays are exact.
local function newSession(extra)
  local env = { os = fakeOs(extra and extra.label), loop = extra and extra.loop or fakeLoop(), http = fakeHttp(), state = {}, logs = {} }
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

-- Undone after each case, failed or not (the fake CraftOS globals), so the suite can run on a
-- real computer without leaving it changed.
local cleanups = {}
local function onCleanup(fn) cleanups[#cleanups + 1] = fn end
local function runCleanups()
  for i = #cleanups, 1, -1 do pcall(cleanups[i]) end
  cleanups = {}
end

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
  raises(function() lib.computerRequest('', 'm-1', 't') end, 'bad argument #1 %(non%-empty string expected, got empty string%)', 'empty sender')
  raises(function() lib.computerRequest('7:', nil, 't') end, 'bad argument #2', 'missing messageId')
  raises(function() lib.computerRequest('7:', 'm', 't', 'x') end, 'bad argument #4 .-%(table expected, got string%)', 'string payload')
end)

test('computerResponse has payload when ok and error when not', function()
  local ok = lib.computerResponse('7:a', 'g-1', 'ping', true, { traposId = '7:a' })
  eq(ok, { event = 'computer_response', traposSenderId = '7:a', messageId = 'g-1', type = 'ping', ok = true, payload = { traposId = '7:a' } }, 'ok frame')
  local bad = lib.computerResponse('7:a', 'g-2', 'x', false, nil, { code = 'unknown_type', message = 'no' })
  eq(bad.error, { code = 'unknown_type', message = 'no' }, 'error')
  eq(bad.payload, nil, 'no payload on error')
  eq(lib.computerResponse('7:a', 'g-3', 'x', false).error.code, 'internal', 'missing error becomes internal')
  raises(function() lib.computerResponse('7:a', 'g', 'x', 'yes') end, 'bad argument #4 .-%(boolean expected, got string%)', 'non-boolean ok')
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

test('another program\'s websockets are never touched', function()
  local env = newSession()
  -- Another tab's sockets (websocket events reach every program): one to another server, one
  -- to the gateway's own URL, one succeeding while the daemon's attempt is open.
  local theirs = { fakeHandle(), fakeHandle(), fakeHandle() }
  env.loop.emit('websocket_success', 'ws://chat.example/', theirs[1])
  env.loop.emit('websocket_success', 'ws://127.0.0.1:4444/gateway', theirs[2])
  local h = open(env)
  env.loop.emit('websocket_success', 'ws://chat.example/?n=1', theirs[3])
  env.loop.emit('websocket_failure', 'ws://chat.example/?n=2', 'refused')
  env.loop.emit('websocket_closed', 'ws://chat.example/', 'bye', 1000)
  for i, handle in ipairs(theirs) do
    eq({ handle.closes, #handle.sent }, { 0, 0 }, 'socket ' .. i .. ' untouched')
  end
  eq(env.session.state(), 'handshaking', 'the daemon\'s own attempt goes on')
  eq(#h.sent, 1, 'its hello sent on its own socket')
end)

test('a second daemon leaves the first one\'s socket alone', function()
  local env = newSession()
  local first = open(env)
  -- Another session on the same computer (another tab) connects: its success reaches the
  -- first session too, which must not close it, and the other way round.
  local other = lib.startSession({ url = 'ws://gw.test:4444/gateway', eventLoop = env.loop, http = env.http,
    os = env.os, encode = encode, decode = decode, random = function() return 0.5 end, state = {} })
  local second = fakeHandle()
  env.loop.emit('websocket_success', env.http.lastUrl(), second)
  eq({ first.closes, second.closes }, { 0, 0 }, 'neither socket closed')
  eq({ #first.sent, #second.sent }, { 1, 1 }, 'one hello each')
  other.stop()
end)

test('a late success of any abandoned attempt is closed, however many came since', function()
  local env = newSession({ connectTimeout = 1, backoffMax = 1 })
  local first = env.http.lastUrl()
  for _ = 1, 40 do env.loop.advance(1) end
  truthy(#env.http.urls > 20, 'many attempts: ' .. #env.http.urls)
  local late = fakeHandle()
  env.loop.emit('websocket_success', first, late)
  eq(late.closes, 1, 'closed')
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
  local all = {}
  local disposeAny = loop.registerAny(function(event, a) all[#all + 1] = event .. ':' .. tostring(a) end)
  loop.dispatch('x', 'a', 'b')
  loop.dispatch('timer', 1)
  loop.dispatch('timer', 1)
  clear()
  loop.dispatch('timer', 2)
  dispose()
  disposeAny()
  loop.dispatch('x', 'c', 'd')
  eq(seen, { 'ab' }, 'handler calls')
  eq(all, { 'x:a', 'timer:1', 'timer:1', 'timer:2' }, 'registerAny sees every event, name first')
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

-- The computer as a sandbox (SPEC §9) ------------------------------------------------

-- Fake CraftOS: an in-memory fs (read-only /rom, a capacity counted like CC:Tweaked, 500 bytes
-- at least per file or folder), a terminal that can be read back like a window, term with
-- redirects, bios-like write/print/printError/sleep, os timers on the fake loop, a shell,
-- textutils.serialize and settings.

local fakeFs = fakes.fs

-- A terminal whose lines can be read back (getLine), like a window.
local function fakeWindow(w, h)
  local t = { w = w or 20, h = h or 5, x = 1, y = 1, rows = {}, draws = 0 }
  local function blank() return (' '):rep(t.w) end
  for i = 1, t.h do t.rows[i] = blank() end
  function t.write(s)
    s = tostring(s)
    t.draws = t.draws + 1
    local row = t.rows[t.y]
    if row and t.x <= t.w and t.x + #s > 1 then
      local from = math.max(t.x, 1)
      local text = s:sub(from - t.x + 1)
      t.rows[t.y] = (row:sub(1, from - 1) .. text .. row:sub(from + #text)):sub(1, t.w)
    end
    t.x = t.x + #s
  end
  function t.blit(s) t.write(s) end
  function t.getCursorPos() return t.x, t.y end
  function t.setCursorPos(x, y) t.x, t.y = math.floor(x), math.floor(y) end
  function t.getSize() return t.w, t.h end
  function t.scroll(n)
    for _ = 1, n do table.remove(t.rows, 1); t.rows[#t.rows + 1] = blank() end
  end
  function t.clear() for i = 1, t.h do t.rows[i] = blank() end end
  function t.clearLine() t.rows[t.y] = blank() end
  function t.setCursorBlink() end
  function t.getCursorBlink() return false end
  function t.isColor() return true end
  t.isColour = t.isColor
  function t.setTextColor(c) t.fg = c end
  t.setTextColour = t.setTextColor
  function t.getTextColor() return t.fg or 1 end
  t.getTextColour = t.getTextColor
  function t.setBackgroundColor() end
  t.setBackgroundColour = t.setBackgroundColor
  function t.getBackgroundColor() return 32768 end
  t.getBackgroundColour = t.getBackgroundColor
  function t.getLine(y) return t.rows[y], ('0'):rep(t.w), ('f'):rep(t.w) end
  function t.text()
    local out = {}
    for i = 1, t.h do out[i] = (t.rows[i]:gsub(' +$', '')) end
    return table.concat(out, '\n'):gsub('\n+$', '')
  end
  return t
end

-- The term API over a native terminal: calls go to the current redirect target.
local function fakeTermApi(native)
  local current = native
  local api = { redirects = 0 }
  function api.redirect(target)
    if type(target) ~= 'table' then error('bad argument #1 (table expected)', 2) end
    api.redirects = api.redirects + 1
    local old = current
    current = target
    return old
  end
  function api.current() return current end
  function api.native() return native end
  return setmetatable(api, { __index = function(_, name) return function(...) return current[name](...) end end })
end

local function fakeShell(fsApi)
  local sh = { dirValue = '', pathValue = '.:/rom/programs' }
  function sh.dir() return sh.dirValue end
  function sh.setDir(d)
    if not fsApi.isDir(d) then error('Not a directory', 2) end
    sh.dirValue = fsApi.combine(d, '')
  end
  function sh.resolve(p)
    if p:sub(1, 1) == '/' then return fsApi.combine('', p) end
    return fsApi.combine(sh.dirValue, p)
  end
  function sh.resolveProgram(command)
    local function found(p)
      if fsApi.exists(p) and not fsApi.isDir(p) then return p end
      if fsApi.exists(p .. '.lua') and not fsApi.isDir(p .. '.lua') then return p .. '.lua' end
    end
    if command:find('/') then return found(sh.resolve(command)) end
    for entry in sh.pathValue:gmatch('[^:]+') do
      local hit = found(fsApi.combine(sh.resolve(entry), command))
      if hit then return hit end
    end
  end
  -- Like CC:Tweaked's shell.execute: the error a program raises is printed with printError.
  function sh.execute(command, ...)
    local path = sh.resolveProgram(command)
    if not path then printError('No such program'); return false end
    local h = fsApi.open(path, 'r')
    local source = h.readAll()
    h.close()
    local env = setmetatable({ shell = sh, arg = { [0] = command, ... } }, { __index = _G })
    local fn, err = load(source, '@/' .. path, 't', env)
    if not fn then printError(err); return false end
    local ok, runErr = pcall(fn, ...)
    if not ok then
      if runErr and runErr ~= '' then printError(runErr) end
      return false
    end
    return true
  end
  return sh
end

local function serialize(value)
  local t = type(value)
  if t == 'string' then return ('%q'):format(value) end
  if t == 'number' or t == 'boolean' or t == 'nil' then return tostring(value) end
  if t ~= 'table' then error('Cannot serialize type ' .. t, 0) end
  local keys = {}
  for k in pairs(value) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = '[' .. serialize(k) .. '] = ' .. serialize(value[k]) end
  return '{ ' .. table.concat(parts, ', ') .. ' }'
end

local function fakeSettings(values)
  local st = { values = values or {}, saved = 0 }
  function st.get(name, default)
    local v = st.values[name]
    if v == nil then return default end
    return v
  end
  function st.set(name, value) st.values[name] = value end
  function st.unset(name) st.values[name] = nil end
  function st.save() st.saved = st.saved + 1; return true end
  return st
end

-- Installs the fake CraftOS globals programs use (undone after the case) on `loop`.
local function installCraftOS(loop, craft)
  local saved = {}
  local names = { 'term', 'write', 'print', 'printError', 'sleep', 'fs', 'textutils', 'settings', 'os', 'traposSandboxScreen', 'traposSandboxRecorder', 'keys' }
  for _, name in ipairs(names) do saved[name] = rawget(_G, name) end
  onCleanup(function() for _, name in ipairs(names) do rawset(_G, name, saved[name]) end end)

  local realOs = saved.os
  local fakeOsApi = setmetatable({}, { __index = realOs })
  local nextTimer = 0
  function fakeOsApi.startTimer(seconds)
    nextTimer = nextTimer + 1
    local id = nextTimer
    craft.timers[id] = loop.setTimeout(function() craft.timers[id] = nil; loop.emit('timer', id) end, seconds)
    return id
  end
  function fakeOsApi.cancelTimer(id) if craft.timers[id] then craft.timers[id](); craft.timers[id] = nil end end
  function fakeOsApi.pullEventRaw(filter) return coroutine.yield(filter) end
  function fakeOsApi.pullEvent(filter)
    local e = table.pack(coroutine.yield(filter))
    if e[1] == 'terminate' then error('Terminated', 0) end
    return table.unpack(e, 1, e.n)
  end
  function fakeOsApi.queueEvent(...)
    local e = table.pack(...)
    loop.setTimeout(function() loop.emit(table.unpack(e, 1, e.n)) end, 0)
  end
  function fakeOsApi.epoch() return loop.now * 1000 end

  rawset(_G, 'os', fakeOsApi)
  rawset(_G, 'term', craft.term)
  rawset(_G, 'fs', craft.fs)
  rawset(_G, 'textutils', { serialize = serialize })
  rawset(_G, 'settings', craft.settings)
  -- bios-like write (no word wrap), print, printError and sleep, going through the globals.
  rawset(_G, 'write', function(text)
    text = tostring(text)
    local lines = 0
    local _, h = _G.term.getSize()
    for piece, newline in text:gmatch('([^\n]*)(\n?)') do
      if piece ~= '' then _G.term.write(piece) end
      if newline ~= '' then
        local _, y = _G.term.getCursorPos()
        if y + 1 <= h then _G.term.setCursorPos(1, y + 1) else _G.term.setCursorPos(1, h); _G.term.scroll(1) end
        lines = lines + 1
      end
    end
    return lines
  end)
  rawset(_G, 'print', function(...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    return _G.write(table.concat(parts, '\t') .. '\n')
  end)
  rawset(_G, 'printError', function(...)
    local old = _G.term.getTextColor()
    _G.term.setTextColor(16384)
    _G.print(...)
    _G.term.setTextColor(old)
  end)
  rawset(_G, 'sleep', function(seconds)
    local id = _G.os.startTimer(seconds or 0)
    repeat local _, t = _G.os.pullEvent('timer') until t == id
  end)
end

local ALL = 'exec,eval,fs.read,fs.write,screen,input,peripheral'

--[[ A ready session on a fake CraftOS. extra: allow (sandbox.allow, default all), capacity,
noShell, and any startSession option. Returns env with craft = { fs, native, term, shell,
settings }, h (the socket) and ask(type, payload) -> messageId. ]]
local function sandbox(extra)
  extra = extra or {}
  local loop = extra.loop or fakeLoop()
  local craft = { timers = {} }
  craft.fs = fakeFs(extra.capacity)
  craft.fs.dirs['rom'], craft.fs.dirs['rom/programs'] = true, true
  craft.native = fakeWindow(30, 6)
  craft.term = fakeTermApi(craft.native)
  craft.shell = fakeShell(craft.fs)
  craft.settings = fakeSettings({ ['sandbox.allow'] = extra.allow == nil and ALL or extra.allow })
  installCraftOS(loop, craft)
  local opts = {
    loop = loop, fs = craft.fs, term = craft.term, settings = craft.settings, textutils = { serialize = serialize },
    shell = not extra.noShell and craft.shell or nil, clock = function() return loop.now * 1000 end,
  }
  for k, v in pairs(extra) do
    if k ~= 'allow' and k ~= 'capacity' and k ~= 'noShell' then opts[k] = v end
  end
  local env = newSession(opts)
  env.craft = craft
  env.h, env.hello = connected(env)
  function env.ask(msgType, payload, messageId)
    messageId = messageId or lib.newMessageId(env.os)
    env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayRequest('7:', messageId, msgType, payload)), false)
    return messageId
  end
  -- The frames answering `messageId`: partials in order, and the final one (or nil).
  function env.answers(messageId)
    local partials, final = {}, nil
    for _, frame in ipairs(env.h.frames()) do
      if frame.messageId == messageId and frame.event == 'computer_response' then
        if frame.partial then
          truthy(final == nil, 'partial after the final answer')
          partials[#partials + 1] = frame
        else
          truthy(final == nil, 'two final answers')
          final = frame
        end
      end
    end
    return final, partials
  end
  function env.final(messageId)
    local final = env.answers(messageId)
    truthy(final, 'a final answer to ' .. messageId)
    return final
  end
  -- One request answered at once: its final frame.
  function env.call(msgType, payload)
    return env.final(env.ask(msgType, payload))
  end
  -- A file part as the gateway sends it to a client taking binary parts: the request's frame,
  -- a newline, `raw`, in one binary message. Its final frame (nil if none).
  function env.callBinary(msgType, payload, raw)
    local messageId = lib.newMessageId(env.os)
    local header = encode(lib.gatewayRequest('7:', messageId, msgType, payload))
    env.loop.emit('websocket_message', env.http.lastUrl(), header .. '\n' .. raw, true)
    return (env.answers(messageId))
  end
  function env.program(path, source) craft.fs.put(path, source) end
  return env
end

local function okPayload(frame, what)
  if not frame.ok then error((what or 'answer') .. ' failed: ' .. fmt(frame.error), 2) end
  return frame.payload
end

local function errorCode(frame)
  return frame.ok == false and frame.error.code or nil
end

-- Consent ----------------------------------------------------------------------

test('capabilities parse in order and change with allow and deny', function()
  eq(lib.parseCapabilities(nil), {}, 'unset')
  eq(lib.parseCapabilities(''), {}, 'empty')
  eq(lib.parseCapabilities('screen, exec,,bogus fs.read'), { 'exec', 'fs.read', 'screen' }, 'ordered, unknown dropped')
  local value, list = lib.changeCapabilities('', true, { 'fs.write', 'exec' })
  eq({ value, list }, { 'exec,fs.write', { 'exec', 'fs.write' } }, 'allow two')
  eq((lib.changeCapabilities('exec,fs.write', false, { 'exec' })), 'fs.write', 'deny one')
  eq((lib.changeCapabilities('exec', true, { 'all' })), ALL, 'allow all')
  eq((lib.changeCapabilities(ALL, false, { 'all' })), '', 'deny all')
  -- turtle (a moving machine) is allowed by name only; deny all takes it back too.
  eq((lib.changeCapabilities('', true, { 'all', 'turtle' })), ALL .. ',turtle', 'allow all and turtle')
  eq((lib.changeCapabilities('turtle', false, { 'all' })), '', 'deny all takes turtle')
  eq(lib.grantsTurtle({ 'all' }), false, 'all is not turtle')
  eq(lib.grantsTurtle({ 'exec', 'turtle' }), true, 'turtle by name')
  local bad, message = lib.changeCapabilities('exec', true, { 'eval', 'rm' })
  eq(bad, nil, 'unknown name changes nothing')
  truthy(message:find('unknown capability rm', 1, true) and message:find('fs.write', 1, true), 'says what is known: ' .. message)
  eq(select(2, lib.changeCapabilities('', true, {})) ~= nil, true, 'no names is an error')
end)

test('consentFromArgument reads --allow= as the installer and sandbox setup take it', function()
  eq({ lib.consentFromArgument('none') }, { '', {} }, 'none allows nothing')
  eq({ lib.consentFromArgument('') }, { '', {} }, 'empty allows nothing')
  local value, notes = lib.consentFromArgument('fs.read,screen')
  eq({ value, notes }, { 'fs.read,screen', {} }, 'no note for files and screen')
  value, notes = lib.consentFromArgument('all')
  eq({ value, notes }, { ALL, { lib.WHOLE_COMPUTER } }, 'all: the whole-computer note')
  value, notes = lib.consentFromArgument('eval,turtle')
  eq({ value, notes }, { 'eval,turtle', { lib.WHOLE_COMPUTER, lib.MOVING_MACHINE } }, 'both notes')
  local bad, message = lib.consentFromArgument('exec,rm')
  eq(bad, nil, 'unknown name refused')
  truthy(message:find('unknown capability rm', 1, true), message)
end)

test('askConsent asks once, and a turtle once more, in the same words', function()
  local function run(answers, isTurtle)
    local asked, i = {}, 0
    local value = lib.askConsent(function(s) asked[#asked + 1] = s end,
      function() i = i + 1 return answers[i] end, isTurtle)
    return value, asked
  end
  local value, asked = run({ 'y' }, false)
  eq(value, ALL, 'y allows all but turtle')
  eq(#asked, 1, 'one question on a computer')
  truthy(asked[1]:find(lib.WHOLE_COMPUTER, 1, true) and asked[1]:find('[y/N]', 1, true), asked[1])
  eq((run({ '' }, false)), '', 'enter allows nothing')
  eq((run({ 'no' }, false)), '', 'no allows nothing')
  value, asked = run({ 'n', ' Yes' }, true)
  eq(value, 'turtle', 'a turtle: driving only')
  truthy(#asked == 2 and asked[2]:find(lib.MOVING_MACHINE, 1, true), 'the turtle question')
  eq((run({ 'y', 'y' }, true)), ALL .. ',turtle', 'a turtle: both')
end)

test('gatewayUrl takes the base URL or the WebSocket URL', function()
  eq(lib.gatewayUrl('http://host:4444'), 'ws://host:4444/gateway', 'http')
  eq(lib.gatewayUrl(' https://example.org/ '), 'wss://example.org/gateway', 'https, trimmed')
  eq(lib.gatewayUrl('ws://10.0.0.1:4444/gateway'), 'ws://10.0.0.1:4444/gateway', 'ws kept')
  eq(lib.gatewayUrl('HTTP://h:1'), 'ws://h:1/gateway', 'scheme in capitals')
  for _, bad in ipairs({ '', 'host:4444', 'ftp://host', 'http:///x', 'http://a b' }) do
    local url, message = lib.gatewayUrl(bad)
    eq(url, nil, 'refused: ' .. bad)
    truthy(type(message) == 'string' and message ~= '', 'says why: ' .. bad)
  end
end)

test('isSetUp is whether sandbox.url was saved', function()
  local saved = rawget(_G, 'settings')
  onCleanup(function() rawset(_G, 'settings', saved) end)
  local values = {}
  rawset(_G, 'settings', { get = function(name) return values[name] end })
  eq(lib.isSetUp(), false, 'nothing saved')
  values['sandbox.password'] = 'pw'
  eq(lib.isSetUp(), false, 'a password alone')
  values['sandbox.url'] = ''
  eq(lib.isSetUp(), false, 'empty url')
  values['sandbox.url'] = 'ws://h/gateway'
  eq(lib.isSetUp(), true, 'url saved')
end)

test('complete answers subcommands, capabilities and ask flags', function()
  local function sorted(list) table.sort(list) return list end
  eq(sorted(lib.complete(nil, 1, 'a', { 'sandbox' })), { 'llow ', 'sk ' }, 'subcommands')
  eq(#lib.complete(nil, 1, '', { 'sandbox' }), #lib.SUBCOMMANDS, 'every subcommand')
  eq(lib.complete(nil, 1, 'setup', { 'sandbox' }), {}, 'a whole word needs nothing')
  eq(sorted(lib.complete(nil, 2, 'e', { 'sandbox', 'allow' })), { 'val ', 'xec ' }, 'capabilities')
  eq(lib.complete(nil, 3, 'e', { 'sandbox', 'deny', 'exec' }), { 'val ' }, 'each once')
  eq(lib.complete(nil, 2, 'a', { 'sandbox', 'deny' }), { 'll ' }, 'all')
  eq(lib.complete(nil, 2, 'fs.', { 'sandbox', 'allow' }), { 'read ', 'write ' }, 'dotted names')
  eq(sorted(lib.complete(nil, 2, '--', { 'sandbox', 'ask' })), { 'new ', 'yes ' }, 'ask flags')
  eq(lib.complete(nil, 3, '--', { 'sandbox', 'ask', 'hello' }), {}, 'no flags inside the prompt')
  eq(lib.complete(nil, 2, 'x', { 'sandbox', 'health' }), {}, 'nothing after health')
end)

test('defineSettings describes sandbox.url, sandbox.password and sandbox.allow', function()
  local saved = rawget(_G, 'settings')
  onCleanup(function() rawset(_G, 'settings', saved) end)
  local defined = {}
  rawset(_G, 'settings', { define = function(name, options) defined[name] = options end })
  lib.defineSettings()
  for _, name in ipairs({ 'sandbox.url', 'sandbox.password', 'sandbox.allow' }) do
    truthy(defined[name] and type(defined[name].description) == 'string' and defined[name].type == 'string', name)
  end
  eq(defined['sandbox.allow'].default, '', 'nothing allowed by default')
  truthy(defined['sandbox.allow'].description:find('fs.write', 1, true), 'the description names the capabilities')
end)

test('hello carries the allowed capabilities', function()
  local env = newSession({ settings = fakeSettings({ ['sandbox.allow'] = 'screen,exec' }) })
  local _, hello = open(env)
  eq(hello.payload.capabilities, { 'exec', 'screen' }, 'allowed list')
  local none = newSession({ settings = fakeSettings({}) })
  local h = open(none)
  truthy(h.sent[1]:find('"capabilities":{}', 1, true), 'empty list encodes as {}: ' .. h.sent[1])
  eq(lib.hello('7:', 'h', 's').payload.capabilities, {}, 'hello without a list announces none')
end)

test('a change of sandbox.allow is announced once, without a reboot', function()
  local settingsApi = fakeSettings({ ['sandbox.allow'] = 'exec' })
  local env = newSession({ settings = settingsApi })
  local h, hello = open(env)
  settingsApi.set('sandbox.allow', 'exec,eval') -- changed while the hello is in flight
  env.loop.emit('trapos_sandbox_capabilities')
  eq(#h.sent, 1, 'nothing but hello before ready')
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, true), false)
  local announced = h.last()
  eq({ announced.event, announced.type, announced.payload }, { 'computer_request', 'capabilities', { capabilities = { 'exec', 'eval' } } }, 'announced on ready')
  env.loop.emit('trapos_sandbox_capabilities')
  eq(#h.sent, 2, 'no change, no announcement')
  settingsApi.set('sandbox.allow', '')
  env.loop.emit('trapos_sandbox_capabilities')
  eq(#h.sent, 3, 'announced again')
  truthy(h.sent[3]:find('"capabilities":{}', 1, true), 'an empty list: ' .. h.sent[3])
  -- The gateway's ok is consumed by the daemon: no program waits for it.
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayResponse('7:', announced.messageId, 'capabilities', true, {})), false)
  eq(env.os.count('trapos_sandbox_reply'), 0, 'no reply event for the daemon\'s own request')
  eq(env.state.capabilities, {}, 'published')
end)

test('hello carries the stop, and stop and resume are announced once each (SPEC 16)', function()
  local settingsApi = fakeSettings({ ['sandbox.stopped'] = true })
  local env = newSession({ settings = settingsApi })
  local h, hello = open(env)
  eq(hello.payload.stopped, true, 'stopped in hello')
  truthy(hello.payload.stopMessage:find('run "sandbox resume"', 1, true), hello.payload.stopMessage)
  env.loop.emit('websocket_message', env.http.lastUrl(), helloReply(hello, true), false)
  env.loop.emit('trapos_sandbox_stop')
  eq(#h.sent, 1, 'still stopped: nothing more to say')
  settingsApi.set('sandbox.stopped', nil)
  env.loop.emit('trapos_sandbox_stop')
  local resumed = h.last()
  eq({ resumed.event, resumed.type, resumed.payload }, { 'computer_request', 'stopped', { stopped = false } }, 'resume announced')
  env.loop.emit('trapos_sandbox_stop')
  eq(#h.sent, 2, 'announced once')
  settingsApi.set('sandbox.stopped', true)
  env.loop.emit('trapos_sandbox_stop')
  local stopped = h.last()
  eq({ stopped.type, stopped.payload.stopped }, { 'stopped', true }, 'stop announced')
  truthy(stopped.payload.stopMessage:find('sandbox resume', 1, true), 'with how to resume')
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayResponse('7:', stopped.messageId, 'stopped', true, {})), false)
  eq(env.os.count('trapos_sandbox_reply'), 0, 'the gateway\'s ok is the daemon\'s own')
  local plain = newSession({ settings = fakeSettings({}) })
  local _, helloPlain = open(plain)
  eq(helloPlain.payload.stopped, nil, 'not stopped: hello as before')
end)

test('requests outside sandbox.allow are forbidden, ping and cancel need none', function()
  local env = sandbox({ allow = 'fs.read' })
  local needs = { exec = 'exec', eval = 'eval', write_file = 'fs.write', delete_file = 'fs.write', screen = 'screen' }
  for msgType, capability in pairs(needs) do
    local frame = env.call(msgType, { command = 'x', code = '1', path = 'x', content = '' })
    eq(errorCode(frame), 'forbidden', msgType)
    eq(frame.error.message, ('computer 7: has not allowed %s: on it, run "sandbox allow %s"'):format(capability, capability), msgType .. ' message')
  end
  okPayload(env.call('list_files', { path = '/' }), 'list_files with fs.read')
  okPayload(env.call('ping', {}), 'ping')
  eq(okPayload(env.call('cancel', { messageId = 'nothing' })), { cancelled = false }, 'cancel')
  -- Revoked on the computer: refused at once, and the gateway is told.
  env.craft.settings.set('sandbox.allow', '')
  eq(errorCode(env.call('read_file', { path = 'x' })), 'forbidden', 'revoked')
  local frames = env.h.frames()
  local announced
  for _, f in ipairs(frames) do if f.type == 'capabilities' then announced = f end end
  truthy(announced, 'the revocation was announced')
  eq(env.craft.fs.opens, 0, 'no file was opened')
end)

-- turtle (SPEC §16) ----------------------------------------------------------------

test('an ask moves the turtle at most sandbox.turtle_budget times; other moves are not counted', function()
  local moves = 0
  local fakeTurtle = {
    forward = function() moves = moves + 1; return true end,
    turnLeft = function() return true end,
    getFuelLevel = function() return 100 - moves end,
    getSelectedSlot = function() return 1 end,
  }
  local env = sandbox({ allow = 'turtle', turtle = fakeTurtle })
  env.craft.settings.set('sandbox.turtle_budget', 2)
  eq(okPayload(env.call('turtle', { action = 'forward' })), { returns = { true }, fuel = 99, selected = 1 }, 'no ask: a move')
  env.loop.emit(lib.EVENT_SEND, 'ask-1', 'ask', { prompt = 'walk' })
  for i = 1, 2 do okPayload(env.call('turtle', { action = 'forward' }), 'move ' .. i) end
  okPayload(env.call('turtle', { action = 'turnLeft' }), 'a turn is no move')
  local refused = env.call('turtle', { action = 'forward' })
  eq(errorCode(refused), 'forbidden', 'past the budget')
  truthy(refused.error.message:find('sandbox.turtle_budget', 1, true), refused.error.message)
  eq(moves, 3, 'the refused move did not run')
  -- The ask ends: moves are free again.
  env.loop.emit('websocket_message', env.http.lastUrl(), encode(lib.gatewayResponse('7:', 'ask-1', 'ask', true, {})), false)
  okPayload(env.call('turtle', { action = 'forward' }), 'after the ask')
end)

test('Lua values are made JSON: lists, objects, type names, cycles cut', function()
  local t = { 1, 2, { a = true } }
  t[3].back = t
  eq(lib.toJsonValue(t), { 1, 2, { a = true, back = 'table' } }, 'cycle')
  eq(lib.toJsonValue({ [1] = 'a', [3] = 'c' }), { ['1'] = 'a', ['3'] = 'c' }, 'a sparse table is an object')
  eq(lib.toJsonValue(print), 'function', 'function')
  eq(lib.toJsonValue(math.huge), 'inf', 'infinity')
  eq(lib.toJsonValue({ [true] = 1 }), { ['true'] = 1 }, 'other keys as text')
end)

-- exec -----------------------------------------------------------------------------

test('exec runs a program, captures stdout and stderr, and shows it on the screen', function()
  local env = sandbox()
  env.program('hello.lua', [[
print('hello', 'world')
write('no newline')
term.write(' term')
print()
printError('careful')
term.setCursorPos(1, 5)
term.write('at row 5')
]])
  local answer = okPayload(env.call('exec', { command = 'hello' }))
  eq(answer.exitCode, 0, 'exitCode')
  eq(answer.timedOut, false, 'timedOut')
  eq(answer.stdout, 'hello\tworld\nno newline term\n\nat row 5', 'stdout')
  eq(answer.stderr, 'careful\n', 'stderr')
  eq(answer.stdoutTruncated, nil, 'not truncated')
  truthy(type(answer.durationMs) == 'number', 'durationMs')
  truthy(env.craft.native.text():find('hello world', 1, true) or env.craft.native.text():find('hello\tworld', 1, true), 'drawn on the screen: ' .. env.craft.native.text())
  truthy(env.craft.native.text():find('careful', 1, true), 'stderr drawn too')
  eq(_G.term.current(), env.craft.native, 'the daemon\'s terminal is back')
  eq(_G.write ~= nil and _G.printError ~= nil, true, 'globals kept')
  local again = okPayload(env.call('exec', { command = 'hello' }))
  eq(again.stdout, answer.stdout, 'the swapped globals were put back and work again')
end)

test('the capture terminal takes a metatable-backed parent\'s methods by name', function()
  local win = fakeWindow(20, 3)
  local parent = setmetatable({ write = function(text) return win.write(text) end }, { __index = win })
  local cap = lib.newCapture(100)
  local t = cap:terminal(parent)
  for _, name in ipairs({ 'isColour', 'isColor', 'getSize', 'getCursorPos', 'clear', 'getLine', 'blit' }) do
    eq(type(t[name]), 'function', name .. ' reached through __index')
  end
  eq(t.setGraphicsMode, nil, 'a method the parent lacks stays absent')
  eq(t.isColour(), true, 'isColour answers')
  t.write('seen')
  eq(cap:text('stdout'), 'seen', 'recorded')
  eq(win.text(), 'seen', 'drawn on the parent')
end)

test('exec of a failing or missing program exits 1 with the error on stderr', function()
  local env = sandbox()
  env.program('boom.lua', "print('before') error('it broke', 0)")
  local answer = okPayload(env.call('exec', { command = 'boom' }))
  eq({ answer.exitCode, answer.stdout, answer.stderr }, { 1, 'before\n', 'it broke\n' }, 'raised error')
  local missing = okPayload(env.call('exec', { command = 'nope' }))
  eq({ missing.exitCode, missing.stderr }, { 1, 'No such program\n' }, 'not found')
end)

test('exec resolves the command on the shell path, with args and cwd', function()
  local env = sandbox()
  env.program('rom/programs/echo.lua', "print(table.concat({ ... }, ' ')) print(shell.dir())")
  env.program('work/tool.lua', "print('tool in ' .. shell.dir())")
  local answer = okPayload(env.call('exec', { command = 'echo', args = { 'a b', 'c' } }))
  eq(answer.stdout, 'a b c\n\n', 'found on the path, args verbatim, cwd /')
  answer = okPayload(env.call('exec', { command = 'tool', cwd = '/work' }))
  eq(answer.stdout, 'tool in work\n', 'relative to cwd, which the program sees')
  answer = okPayload(env.call('exec', { command = 'echo', args = {}, cwd = 'work' }))
  eq(answer.stdout, '\nwork\n', 'empty args as {}')
  eq(env.craft.shell.dir(), '', 'the daemon\'s shell directory is back')
end)

test('exec without a shell loads the program itself', function()
  local env = sandbox({ noShell = true })
  env.program('rom/programs/greet.lua', "print('hi ' .. (...)) error('late')")
  local answer = okPayload(env.call('exec', { command = 'greet', args = { 'you' } }))
  eq(answer.exitCode, 1, 'failed')
  eq(answer.stdout, 'hi you\n', 'ran with args')
  truthy(answer.stderr:find('late', 1, true), 'error on stderr: ' .. answer.stderr)
  eq(okPayload(env.call('exec', { command = 'gone' })).stderr, 'No such program\n', 'missing')
end)

test('exec gets events like parallel: timers, its filter, terminate', function()
  local env = sandbox()
  env.program('wait.lua', [[
local _, value = os.pullEvent('custom')
print('got ' .. value)
sleep(2)
print('slept')
]])
  local id = env.ask('exec', { command = 'wait' })
  env.loop.emit('other', 'ignored')
  env.loop.emit('custom', 'x')
  eq(env.answers(id), nil, 'still sleeping')
  env.loop.advance(1.9)
  eq(env.answers(id), nil, 'not yet')
  env.loop.advance(0.1)
  eq(okPayload(env.final(id)).stdout, 'got x\nslept\n', 'woke on its timer')
  eq(#env.loop.any, 0, 'no listener left')
end)

test('exec works on a loop without registerAny, through the known event names', function()
  local inner = fakeLoop()
  local plain = { register = inner.register, setTimeout = inner.setTimeout }
  local env = sandbox({ loop = inner, eventLoop = plain })
  env.program('nap.lua', "sleep(1) local _, v = os.pullEvent('trapos_sandbox_reply') print(v)")
  local id = env.ask('exec', { command = 'nap' })
  inner.advance(1)
  inner.emit('trapos_sandbox_reply', 'r-1')
  eq(okPayload(env.final(id)).stdout, 'r-1\n', 'timer and a known event reached it')
  eq(#inner.any, 0, 'registerAny was not used')
  local left = 0
  for _, list in pairs(inner.handlers) do left = left + #list end
  local sessionHandlers = 8 -- SESSION_EVENTS: the websocket four, send, capabilities, stop, redstone
  eq(left, sessionHandlers, 'the program\'s listeners are gone, the session\'s remain')
end)

test('a ping is answered at once while a long exec runs', function()
  local env = sandbox()
  env.program('long.lua', "for i = 1, 30 do sleep(1) end print('done')")
  local id = env.ask('exec', { command = 'long', timeoutMs = 60000 })
  env.loop.advance(5)
  local ping = env.call('ping', {})
  eq(okPayload(ping), { traposId = '7:' }, 'ping answered mid-run')
  eq(env.answers(id), nil, 'exec still running')
  env.loop.advance(25)
  eq(okPayload(env.final(id)).stdout, 'done\n', 'exec finished')
end)

test('exec timeout terminates a program that loops with sleep', function()
  local env = sandbox()
  env.program('loop.lua', "while true do print('tick') sleep(1) end")
  local id = env.ask('exec', { command = 'loop', timeoutMs = 2500 })
  env.loop.advance(2.4)
  eq(env.answers(id), nil, 'running before the timeout')
  env.loop.advance(0.1)
  local answer = okPayload(env.final(id))
  eq(answer.timedOut, true, 'timedOut')
  eq(answer.exitCode, 1, 'exitCode')
  eq(answer.stdout, 'tick\ntick\ntick\n', 'output so far')
  eq(answer.stderr, 'Terminated\n', 'the terminate error')
  eq(answer.durationMs, 2500, 'durationMs')
  local programTimers = 0
  for _ in pairs(env.craft.timers) do programTimers = programTimers + 1 end
  eq(env.loop.pending(), programTimers, 'only the program\'s own sleep timer is left')
end)

test('a program that ignores terminate is abandoned after a grace second', function()
  local env = sandbox()
  env.program('stubborn.lua', "while true do os.pullEventRaw() end")
  local id = env.ask('exec', { command = 'stubborn', timeoutMs = 1000 })
  env.loop.advance(1)
  eq(env.answers(id), nil, 'gets its grace')
  env.loop.advance(1)
  local answer = okPayload(env.final(id))
  eq({ answer.timedOut, answer.exitCode }, { true, 1 }, 'abandoned with timedOut')
  truthy(answer.stderr:find('abandoned', 1, true), 'says so: ' .. answer.stderr)
  eq(#env.loop.any, 0, 'no longer resumed')
end)

test('cancel terminates a running exec, which ends with cancelled', function()
  local env = sandbox()
  env.program('loop.lua', "while true do sleep(1) end")
  local id = env.ask('exec', { command = 'loop' })
  env.loop.advance(3)
  local cancel = env.call('cancel', { messageId = id })
  eq(okPayload(cancel), { cancelled = true }, 'cancel answer')
  local final = env.final(id)
  eq({ final.ok, final.error.code }, { false, 'cancelled' }, 'the cancelled request')
  eq(okPayload(env.call('cancel', { messageId = id })), { cancelled = false }, 'nothing left to cancel')
  eq(errorCode(env.call('cancel', {})), 'bad_request', 'cancel needs a messageId')
end)

test('exec output streams as coalesced partials, then one final answer', function()
  local env = sandbox()
  env.program('chatty.lua', [[
print('one')
sleep(0.05)
print('two')
sleep(0.03)
printError('three')
sleep(0.5)
write(('x'):rep(5000))
sleep(0.01)
print('end')
]])
  local id = env.ask('exec', { command = 'chatty' })
  local _, partials = env.answers(id)
  eq(#partials, 1, 'the first output goes at once')
  eq(partials[1], { event = 'computer_response', traposSenderId = '7:', messageId = id, type = 'exec', ok = true, partial = true,
    payload = { type = 'stdout_delta', data = 'one\n' } }, 'partial frame')
  env.loop.advance(0.08)
  eq(#select(2, env.answers(id)), 1, 'two and three wait for 100 ms')
  env.loop.advance(0.02)
  _, partials = env.answers(id)
  eq(#partials, 2, 'sent at 100 ms, one partial per flush')
  eq(partials[2].payload, { type = 'stdout_delta', data = 'two\n' }, 'stdout first')
  env.loop.advance(0.1)
  _, partials = env.answers(id)
  eq(partials[3].payload, { type = 'stderr_delta', data = 'three\n' }, 'then stderr, 100 ms later')
  env.loop.advance(0.3)
  _, partials = env.answers(id)
  eq(#partials, 3, 'quiet while sleeping')
  env.loop.advance(0.085)
  local final
  final, partials = env.answers(id)
  eq(#partials, 4, '4 KiB goes at once')
  eq(#partials[4].payload.data, 5000, 'the big write')
  eq(final, nil, 'still running')
  env.loop.advance(0.01)
  final, partials = env.answers(id)
  eq(#partials, 5, 'what was left is sent before the final answer')
  local streamed = { stdout_delta = {}, stderr_delta = {} }
  for _, p in ipairs(partials) do table.insert(streamed[p.payload.type], p.payload.data) end
  local answer = okPayload(final)
  eq(table.concat(streamed.stdout_delta), answer.stdout, 'stdout partials add up to the final stdout')
  eq(table.concat(streamed.stderr_delta), answer.stderr, 'stderr partials add up to the final stderr')
  eq(answer.stdout, 'one\ntwo\n' .. ('x'):rep(5000) .. 'end\n', 'final stdout')
end)

test('exec output beyond maxOutputBytes is dropped and flagged', function()
  local env = sandbox()
  env.program('flood.lua', "for i = 1, 100 do write('0123456789') end printError('e1') printError('e2')")
  local id = env.ask('exec', { command = 'flood', maxOutputBytes = 25 })
  local final, partials = env.answers(id)
  local answer = okPayload(final)
  eq(answer.stdout, ('0123456789'):rep(2) .. '01234', 'stdout cut at 25 bytes')
  eq(answer.stdoutTruncated, true, 'flagged')
  eq(answer.stderr, 'e1\ne2\n', 'stderr has its own budget')
  eq(answer.stderrTruncated, nil, 'stderr fits')
  local total = 0
  for _, p in ipairs(partials) do total = total + #p.payload.data end
  eq(total, 31, 'partials carry only what was kept')
end)

test('an answer too large for one frame is shrunk or refused, never sent', function()
  local env = sandbox()
  -- Control characters are escaped six times over: 64 KiB of them cannot fit in 128 KiB.
  env.program('binary.lua', "write(('\\1'):rep(65536))")
  local id = env.ask('exec', { command = 'binary' })
  local final, partials = env.answers(id)
  for i, s in ipairs(env.h.sent) do truthy(#s <= lib.MAX_SEND, 'frame ' .. i .. ' is ' .. #s .. ' bytes') end
  local answer = okPayload(final)
  eq(answer.stdoutTruncated, true, 'the final stdout was cut to fit')
  truthy(#answer.stdout < 65536 and #answer.stdout > 0, 'kept a part: ' .. #answer.stdout)
  local streamed = 0
  for _, p in ipairs(partials) do streamed = streamed + #p.payload.data end
  eq(streamed, 65536, 'the partials carried all of it')
  -- A handler answer that cannot shrink becomes too_large.
  local ctx = msgCtx()
  ctx.handlers = { big = function(req) req.respond(true, { blob = ('a'):rep(200000) }) end }
  lib.onMessage(encode(lib.gatewayRequest('7:t', 'g-1', 'big')), ctx)
  eq(ctx.sent[1].error.code, 'too_large', 'too_large')
end)

test('jobs stop when their connection drops', function()
  local env = sandbox()
  env.program('loop.lua', "local ok = pcall(function() while true do sleep(1) end end) _G.sawTerminate = not ok")
  local id = env.ask('exec', { command = 'loop' })
  local before = #env.h.sent
  env.loop.emit('websocket_closed', env.http.lastUrl())
  eq(rawget(_G, 'sawTerminate'), true, 'the program got terminate')
  eq(#env.h.sent, before, 'nothing sent on the dead socket')
  eq(env.session.status().jobs, 0, 'no job left')
  eq(#env.loop.any, 0, 'no listener left')
  rawset(_G, 'sawTerminate', nil)
  eq(env.answers(id), nil, 'no answer')
end)

test('exec bad requests', function()
  local env = sandbox()
  for _, payload in ipairs({ {}, { command = '' }, { command = 5 }, { command = 'x', args = { 1 } }, { command = 'x', args = 'a' },
    { command = 'x', cwd = '/nowhere' }, { command = 'x', timeoutMs = -1 }, { command = 'x', maxOutputBytes = 'lots' } }) do
    eq(errorCode(env.call('exec', payload)), 'bad_request', 'exec ' .. encode(payload))
  end
  eq(errorCode(env.call('eval', {})), 'bad_request', 'eval without code')
end)

-- eval -----------------------------------------------------------------------------

test('eval returns serialized values and captures what it prints', function()
  local env = sandbox()
  eq(okPayload(env.call('eval', { code = '1 + 1' })), { ok = true, returns = { '2' }, stdout = '', durationMs = 0, timedOut = false }, 'an expression')
  local answer = okPayload(env.call('eval', { code = "local x = 2 print('p') printError('q') return x, 'a', nil, { k = true }" }))
  eq(answer.returns, { '2', '"a"', 'nil', '{ ["k"] = true }' }, 'statements with returns')
  eq(answer.stdout, 'p\nq\n', 'print and printError in stdout')
  eq(okPayload(env.call('eval', { code = 'print' })).returns[1]:match('^function'), 'function', 'a function becomes tostring')
  eq(okPayload(env.call('eval', { code = 'return fs ~= nil and term ~= nil' })).returns, { 'true' }, 'the computer\'s globals')
  okPayload(env.call('eval', { code = 'counter = 41' }))
  eq(okPayload(env.call('eval', { code = 'counter + 1' })).returns, { '42' }, 'assignments last for the session')
  eq(rawget(_G, 'counter'), nil, 'without touching _G')
end)

test('eval compile and runtime errors are ok false with the error', function()
  local env = sandbox()
  local answer = okPayload(env.call('eval', { code = 'return +' }))
  eq({ answer.ok, answer.returns }, { false, {} }, 'compile error')
  truthy(answer.error:find('eval:1:', 1, true), 'with position: ' .. answer.error)
  answer = okPayload(env.call('eval', { code = "print('half') error('bad thing')" }))
  eq({ answer.ok, answer.stdout }, { false, 'half\n' }, 'runtime error')
  truthy(answer.error:find('bad thing', 1, true), answer.error)
end)

test('eval times out like exec', function()
  local env = sandbox()
  local id = env.ask('eval', { code = 'while true do sleep(1) end', timeoutMs = 1500 })
  env.loop.advance(1.5)
  local answer = okPayload(env.final(id))
  eq({ answer.ok, answer.timedOut, answer.error }, { false, true, 'Terminated' }, 'timed out')
end)

-- Files ----------------------------------------------------------------------------

test('base64 matches known vectors', function()
  local vectors = { [''] = '', f = 'Zg==', fo = 'Zm8=', foo = 'Zm9v', foob = 'Zm9vYg==', fooba = 'Zm9vYmE=', foobar = 'Zm9vYmFy' }
  for plain, coded in pairs(vectors) do
    eq(lib.base64Encode(plain), coded, 'encode ' .. plain)
    eq(lib.base64Decode(coded), plain, 'decode ' .. coded)
  end
  eq(lib.base64Decode('Zm9v\nYmFy '), 'foobar', 'whitespace ignored')
  for _, bad in ipairs({ 'Zm9', 'Zm9v!A==', '=Zm9', 'Zg=a' }) do
    local value, err = lib.base64Decode(bad)
    eq(value, nil, 'rejects ' .. bad)
    truthy(type(err) == 'string', 'with a reason')
  end
end)

test('base64 round trips all 256 byte values', function()
  local bytes = {}
  for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
  local all = table.concat(bytes)
  local coded = lib.base64Encode(all)
  eq(coded, 'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==', 'known encoding')
  eq(lib.base64Decode(coded), all, 'decodes back')
  for cut = 1, 3 do eq(lib.base64Decode(lib.base64Encode(all:sub(cut))), all:sub(cut), 'length ' .. (256 - cut + 1)) end
end)

-- Deterministic binary data: every byte value, in an order that does not repeat quickly.
local function binaryData(n)
  local codes, parts, seed = {}, {}, 12345
  for i = 1, n do
    seed = (seed * 1103515245 + 12345) % 2147483648
    codes[#codes + 1] = math.floor(seed / 65536) % 256
    if #codes == 1024 or i == n then parts[#parts + 1] = string.char(table.unpack(codes)); codes = {} end
  end
  return table.concat(parts)
end

test('a 300 KB file written in parts reads back identical in chunks', function()
  local env = sandbox({ capacity = 2000000 })
  local data = binaryData(300000)
  env.craft.fs.put('big.bin', 'old contents')
  local chunk = lib.MAX_CONTENT
  local offset = 0
  while offset < #data do
    local piece = data:sub(offset + 1, offset + chunk)
    local final = offset + #piece >= #data
    local answer = okPayload(env.call('write_file', { path = '/big.bin', content = lib.base64Encode(piece), encoding = 'base64',
      part = { offset = offset, final = final } }), 'part at ' .. offset)
    offset = offset + #piece
    eq({ answer.bytesWritten, answer.sizeBytes }, { #piece, offset }, 'part answer at ' .. offset)
    if not final then eq(env.craft.fs.files['big.bin'], 'old contents', 'the old file stays until the last part') end
  end
  eq(#env.craft.fs.files['big.bin'], 300000, 'replaced whole')
  eq(env.craft.fs.list(''), { 'big.bin', 'rom' }, 'no temporary file left')
  local got, at = {}, 0
  repeat
    local answer = okPayload(env.call('read_file', { path = 'big.bin', offset = at, encoding = 'base64' }))
    eq({ answer.encoding, answer.sizeBytes, answer.offset }, { 'base64', 300000, at }, 'read answer at ' .. at)
    got[#got + 1] = lib.base64Decode(answer.content)
    eq(#got[#got], answer.bytesRead, 'bytesRead')
    truthy(answer.bytesRead <= lib.MAX_CONTENT, 'at most 64 KiB a frame')
    at = at + answer.bytesRead
  until answer.bytesRead == 0
  eq(#got, 6, 'five chunks and an empty one')
  truthy(table.concat(got) == data, 'identical bytes')
  for i, s in ipairs(env.h.sent) do truthy(#s <= lib.MAX_SEND, 'frame ' .. i .. ' is ' .. #s .. ' bytes') end
  eq(env.craft.fs.opens, env.craft.fs.closes, 'every handle closed once')
end)

test('a write in parts is refused at its first part when the whole file does not fit', function()
  local env = sandbox({ capacity = 5000 })
  env.craft.fs.put('keep.txt', 'kept')
  local before = env.craft.fs.used()
  local write = function(offset, size, text)
    return env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(text), encoding = 'base64',
      part = { offset = offset, final = false, size = size } })
  end
  -- Free: 4500. The first part (1000 bytes) would fit; the whole 4600 does not.
  local frame = write(0, 4600, ('a'):rep(1000))
  eq(frame.error, { code = 'fs_error', message = 'Out of space: writing /keep.txt needs 4600 bytes, 4500 free '
    .. '(/keep.txt is unchanged)' }, 'refused before anything is written')
  eq(env.craft.fs.list(''), { 'keep.txt', 'rom' }, 'no temporary file')
  eq(env.craft.fs.used(), before, 'no space used')
  eq(env.craft.fs.opens, 0, 'nothing opened')
  eq(errorCode(write(0, 10, ('a'):rep(20))), 'bad_request', 'a size below what the part holds')
  eq(errorCode(write(0, 'big', 'a')), 'bad_request', 'a size that is no number')
end)

test('a later part that does not fit takes the temporary file with it', function()
  local env = sandbox({ capacity = 5000 })
  env.craft.fs.put('keep.txt', 'kept')
  local before = env.craft.fs.used()
  -- An older gateway sends no size: the first part fits, the second does not.
  okPayload(env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(('a'):rep(3000)), encoding = 'base64',
    part = { offset = 0, final = false } }))
  local frame = env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(('b'):rep(3000)),
    encoding = 'base64', part = { offset = 3000, final = true } })
  eq(frame.error, { code = 'fs_error', message = 'Out of space: writing /keep.txt needs 3000 bytes, 1500 free '
    .. '(/keep.txt is unchanged)' }, 'refused')
  eq(env.craft.fs.files['keep.txt'], 'kept', 'the old file is untouched')
  eq(env.craft.fs.list(''), { 'keep.txt', 'rom' }, 'no temporary file left')
  eq(env.craft.fs.used(), before, 'its space given back')
end)

test('a write abandoned half-way is cleared by the next one', function()
  local env = sandbox({ capacity = 5000 })
  env.craft.fs.put('keep.txt', 'kept')
  -- The gateway went away after the first part: its 3000 bytes are left beside the file.
  okPayload(env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(('a'):rep(3000)), encoding = 'base64',
    part = { offset = 0, final = false, size = 4400 } }))
  -- They would leave too little for this one, which fits once they are gone.
  local answer = okPayload(env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(('c'):rep(4000)),
    encoding = 'base64', part = { offset = 0, final = true, size = 4000 } }))
  eq(answer, { bytesWritten = 4000, sizeBytes = 4000 }, 'written')
  eq(env.craft.fs.files['keep.txt'], ('c'):rep(4000), 'replaced whole')
  eq(env.craft.fs.list(''), { 'keep.txt', 'rom' }, 'no temporary file left')
end)

test('write_file parts must follow on from what was received', function()
  local env = sandbox()
  local part1 = lib.base64Encode('hello ')
  okPayload(env.call('write_file', { path = 'a.txt', content = part1, encoding = 'base64', part = { offset = 0, final = false } }))
  local wrong = env.call('write_file', { path = 'a.txt', content = part1, encoding = 'base64', part = { offset = 3, final = true } })
  eq(errorCode(wrong), 'bad_request', 'offset mismatch')
  truthy(wrong.error.message:find('6 bytes', 1, true), wrong.error.message)
  okPayload(env.call('write_file', { path = 'a.txt', content = lib.base64Encode('world'), encoding = 'base64', part = { offset = 6, final = true } }))
  eq(env.craft.fs.files['a.txt'], 'hello world', 'joined')
  eq(errorCode(env.call('write_file', { path = 'b.txt', content = 'abc' })), 'bad_request', 'bad base64')
  eq(errorCode(env.call('write_file', { path = 'b.txt', content = '', encoding = 'utf8' })), 'bad_request', 'other encodings')
  eq(errorCode(env.call('write_file', { path = 'b.txt' })), 'bad_request', 'no content')
  eq(errorCode(env.call('write_file', { content = '' })), 'bad_request', 'no path')
  eq(errorCode(env.call('write_file', { path = 'b.txt', content = lib.base64Encode(('z'):rep(lib.MAX_CONTENT + 1)) })), 'bad_request', 'over 64 KiB in a frame')
end)

test('write_file creates missing folders and writes whole files', function()
  local env = sandbox()
  local answer = okPayload(env.call('write_file', { path = 'deep/er/file.txt', content = lib.base64Encode('x\0y'), encoding = 'base64' }))
  eq(answer, { bytesWritten = 3, sizeBytes = 3 }, 'answer')
  eq(env.craft.fs.files['deep/er/file.txt'], 'x\0y', 'binary-safe')
  okPayload(env.call('write_file', { path = 'deep/er/file.txt', content = '', encoding = 'base64' }))
  eq(env.craft.fs.files['deep/er/file.txt'], '', 'an empty file')
  okPayload(env.call('write_file', { path = 'rel.txt', cwd = '/deep', content = lib.base64Encode('r') }))
  eq(env.craft.fs.files['deep/rel.txt'], 'r', 'relative to cwd')
end)

-- Issue 43 ---------------------------------------------------------------------

local function writePart(env, path, writeId, offset, text, final, size)
  return env.call('write_file', { path = path, content = lib.base64Encode(text), encoding = 'base64',
    part = { offset = offset, final = final, size = size, writeId = writeId } })
end

test('two writes of one file at once each build a temporary file of their own', function()
  for _, order in ipairs({ { 'a', 'b' }, { 'b', 'a' } }) do
    local env = sandbox()
    env.craft.fs.put('f.txt', 'old')
    local text = { a = ('A'):rep(10), b = ('B'):rep(10) }
    local ids = { a = '0123456789abcdef', b = 'fedcba9876543210' }
    -- Their parts interleave: each write's first part, then each one's last.
    okPayload(writePart(env, '/f.txt', ids.a, 0, text.a:sub(1, 5), false, 10), 'a first')
    okPayload(writePart(env, '/f.txt', ids.b, 0, text.b:sub(1, 5), false, 10), 'b first')
    eq(env.craft.fs.files['f.txt'], 'old', 'the old file stays until one is whole')
    local first, last = order[1], order[2]
    okPayload(writePart(env, '/f.txt', ids[first], 5, text[first]:sub(6), true, 10), first .. ' last')
    eq(env.craft.fs.files['f.txt'], text[first], 'the first to finish is on disk, whole')
    local answer = okPayload(writePart(env, '/f.txt', ids[last], 5, text[last]:sub(6), true, 10), last .. ' last')
    eq(answer, { bytesWritten = 5, sizeBytes = 10 }, 'answer')
    eq(env.craft.fs.files['f.txt'], text[last], 'then the other, whole: never parts of both')
    eq(env.craft.fs.list(''), { 'f.txt', 'rom' }, 'no temporary file left')
  end
end)

test('a write id is hex digits and a write abandoned half-way is cleared by the next one', function()
  local env = sandbox({ capacity = 6000 })
  env.craft.fs.put('keep.txt', 'kept')
  env.craft.fs.put('.keep.txt.x.sandbox-part', 'not a temporary file of ours')
  eq(errorCode(writePart(env, '/keep.txt', '../x', 0, 'a', true)), 'bad_request', 'a write id that is a path')
  eq(errorCode(writePart(env, '/keep.txt', ('a'):rep(33), 0, 'a', true)), 'bad_request', 'a write id too long')
  okPayload(writePart(env, '/keep.txt', 'aaaa', 0, ('a'):rep(3000), false, 4400))
  -- The connection goes: that write is abandoned; the next connection's writes go on.
  env.loop.emit('websocket_closed', env.http.lastUrl())
  env.loop.advance(1)
  env.h, env.hello = connected(env)
  local answer = okPayload(writePart(env, '/keep.txt', 'bbbb', 0, ('c'):rep(4000), true, 4000))
  eq(answer, { bytesWritten = 4000, sizeBytes = 4000 }, 'written: the abandoned part was cleared first')
  -- A write of another file clears what was abandoned too: the daemon keeps no write it lost.
  okPayload(writePart(env, '/other.txt', 'cccc', 0, 'half', false, 8))
  eq(env.craft.fs.exists('.other.txt.cccc.sandbox-part'), true, 'its part file')
  env.loop.emit('websocket_closed', env.http.lastUrl())
  env.loop.advance(1)
  env.h, env.hello = connected(env)
  okPayload(writePart(env, '/third.txt', 'dddd', 0, 'x', true, 1))
  eq(env.craft.fs.exists('.other.txt.cccc.sandbox-part'), false, 'another file\'s abandoned part cleared')
  eq(env.craft.fs.files['keep.txt'], ('c'):rep(4000), 'replaced whole')
  eq(env.craft.fs.list(''), { '.keep.txt.x.sandbox-part', 'keep.txt', 'rom', 'third.txt' },
    'only its own temporary files cleared')
end)

test('a write under way is not cleared by another write of the file', function()
  local env = sandbox()
  okPayload(writePart(env, '/f', 'aaaa', 0, 'AAA', false, 6))
  okPayload(writePart(env, '/f', 'bbbb', 0, 'BBBBBB', true, 6))
  okPayload(writePart(env, '/f', 'aaaa', 3, 'AAA', true, 6), 'the first goes on where it was')
  eq(env.craft.fs.files['f'], 'AAAAAA', 'whole')
end)

test('move_file moves a folder in one step and refuses into itself however it is spelt', function()
  local env = sandbox()
  env.craft.fs.put('proj/a.lua', 'a')
  env.craft.fs.put('proj/sub/b.lua', 'b')
  env.craft.fs.put('other/x', 'x')
  for _, to in ipairs({ '/other/../proj/inner', 'proj', '/proj/./sub/deeper', '\\proj\\x' }) do
    local frame = env.call('move_file', { from = '/proj', to = to })
    eq(errorCode(frame), 'bad_request', 'into itself: ' .. to)
    truthy(frame.error.message:find('inside it', 1, true), frame.error.message)
  end
  eq({ env.craft.fs.files['proj/a.lua'], env.craft.fs.files['proj/sub/b.lua'] }, { 'a', 'b' }, 'nothing deleted')
  eq(env.call('move_file', { from = '/proj', to = '/other/x' }).error,
    { code = 'fs_error', message = '/other/x: File exists' }, 'an existing target')
  eq(env.call('move_file', { from = '/nope', to = '/n2' }).error, { code = 'fs_error', message = '/nope: No such file' }, 'missing')
  eq(env.call('move_file', { from = '/rom/programs', to = '/mine' }).error,
    { code = 'fs_error', message = '/rom/programs: Access denied' }, 'read-only')
  eq(errorCode(env.call('move_file', { from = '/proj', to = '/.settings' })), 'forbidden', 'the settings file')
  eq(errorCode(env.call('move_file', { from = '/', to = '/x' })), 'bad_request', 'the root')
  eq(errorCode(env.call('move_file', { from = '/proj' })), 'bad_request', 'no to')
  local answer = okPayload(env.call('move_file', { from = 'proj', to = '/new/place/proj2' }))
  eq(answer, { moved = true, from = '/proj', to = '/new/place/proj2' }, 'answer')
  eq({ env.craft.fs.files['new/place/proj2/a.lua'], env.craft.fs.files['new/place/proj2/sub/b.lua'] }, { 'a', 'b' }, 'moved')
  eq(env.craft.fs.exists('proj'), false, 'gone from where it was')
end)

test('make_folder makes a folder and leaves one that exists as it is', function()
  local env = sandbox()
  env.craft.fs.put('proj/.folder', 'the player\'s own')
  eq(okPayload(env.call('make_folder', { path = '/proj' })), { made = '/proj', existed = true }, 'existing')
  eq(env.craft.fs.files['proj/.folder'], 'the player\'s own', 'nothing in it touched')
  eq(okPayload(env.call('make_folder', { path = 'a/b/../c' })), { made = '/a/c', existed = false }, 'made')
  eq(env.craft.fs.isDir('a/c'), true, 'a folder')
  eq(env.call('make_folder', { path = '/proj/.folder' }).error,
    { code = 'fs_error', message = '/proj/.folder: File exists' }, 'a file')
  eq(env.call('make_folder', { path = '/rom/x' }).error, { code = 'fs_error', message = '/rom/x: Access denied' }, 'read-only')
  eq(errorCode(env.call('make_folder', { path = '/' })), 'bad_request', 'the root')
end)

test('move_file and make_folder need fs.write and hello announces them', function()
  local env = sandbox({ allow = 'fs.read' })
  env.craft.fs.put('a', 'a')
  eq(errorCode(env.call('move_file', { from = '/a', to = '/b' })), 'forbidden', 'move')
  eq(errorCode(env.call('make_folder', { path = '/d' })), 'forbidden', 'folder')
  eq(env.craft.fs.files['a'], 'a', 'nothing moved')
  eq(lib.hello('7:lab', 'h-1', 'pw').payload.features,
    { 'write_id', 'move_file', 'make_folder', 'binary_parts', 'write_files' }, 'features')
  eq(lib.REQUEST_CAPABILITY.move_file, 'fs.write', 'move_file capability')
  eq(lib.REQUEST_CAPABILITY.make_folder, 'fs.write', 'make_folder capability')
end)

test('file parts cross as binary messages, byte for byte, in order', function()
  local env = sandbox()
  local bytes = {}
  for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
  local data = table.concat(bytes):rep(600) -- 153,600 bytes: over one binary part
  local cut = lib.MAX_BINARY_CONTENT
  local first = env.callBinary('write_file', { path = '/b.bin', encoding = 'binary',
    part = { offset = 0, final = false, size = #data, writeId = 'ab12' } }, data:sub(1, cut))
  eq(okPayload(first), { bytesWritten = cut, sizeBytes = cut }, 'first part')
  eq(env.craft.fs.files['b.bin'], nil, 'not in place before the last part')
  local last = env.callBinary('write_file', { path = '/b.bin', encoding = 'binary',
    part = { offset = cut, final = true, size = #data, writeId = 'ab12' } }, data:sub(cut + 1))
  eq(okPayload(last).sizeBytes, #data, 'last part')
  eq(env.craft.fs.files['b.bin'] == data, true, 'the file, byte for byte')
  -- A read asking for binary is answered with one: no base64, its bytes after the frame.
  local id = env.ask('read_file', { path = 'b.bin', offset = 100, encoding = 'binary' })
  local answer = env.final(id)
  eq(answer.payload, { encoding = 'binary', sizeBytes = #data, offset = 100, bytesRead = cut }, 'read answer')
  eq(answer.raw == data:sub(101, 100 + cut), true, 'read bytes')
  eq(env.h.binary[#env.h.sent], true, 'sent as a binary message')
  -- What a binary message must not be: a write with no bytes, or no frame at all.
  eq(errorCode(env.call('write_file', { path = '/c.bin', encoding = 'binary' })), 'bad_request', 'binary in JSON')
  eq(errorCode(env.callBinary('write_file', { path = '/c.bin', encoding = 'binary' }, ('x'):rep(cut + 1))),
    'bad_request', 'over one part')
  local sent = #env.h.sent
  env.loop.emit('websocket_message', env.http.lastUrl(), 'no frame at all', true)
  eq(#env.h.sent, sent, 'a binary message with no header is ignored')
end)

test('write_files writes several whole files from one binary message, in order', function()
  local env = sandbox({ allow = 'fs.read' })
  local batch = { encoding = 'binary', writeId = 'abcd', files = {
    { path = '/a.txt', size = 3 }, { path = '/deep/b.bin', size = 4 }, { path = '/old.txt', size = 2 } } }
  eq(errorCode(env.callBinary('write_files', batch, 'aaa\0\1\2\3zz')), 'forbidden', 'needs fs.write')
  env = sandbox()
  env.craft.fs.put('old.txt', 'the old one')
  local answer = okPayload(env.callBinary('write_files', batch, 'aaa\0\1\2\3zz'))
  eq(answer, { written = { { path = '/a.txt', sizeBytes = 3 }, { path = '/deep/b.bin', sizeBytes = 4 },
    { path = '/old.txt', sizeBytes = 2 } } }, 'answer')
  eq({ env.craft.fs.files['a.txt'], env.craft.fs.files['deep/b.bin'], env.craft.fs.files['old.txt'] },
    { 'aaa', '\0\1\2\3', 'zz' }, 'each file whole')
  eq(env.craft.fs.list(''), { 'a.txt', 'deep', 'old.txt', 'rom' }, 'no temporary file left')
  -- The first that fails stops it: those before it stay written, none after it is.
  batch.files = { { path = '/c.txt', size = 1 }, { path = '/.settings', size = 1 }, { path = '/d.txt', size = 1 } }
  answer = okPayload(env.callBinary('write_files', batch, 'cxd'))
  eq(answer.written, { { path = '/c.txt', sizeBytes = 1 } }, 'written before')
  eq({ answer.failed.path, answer.failed.code }, { '/.settings', 'forbidden' }, 'failed')
  eq({ env.craft.fs.files['c.txt'], env.craft.fs.files['d.txt'] }, { 'c', nil }, 'none after')
  -- What a batch must be.
  eq(errorCode(env.callBinary('write_files', { encoding = 'binary', files = { { path = '/e', size = 2 } } }, 'e')),
    'bad_request', 'sizes that do not add up')
  eq(errorCode(env.callBinary('write_files', { encoding = 'binary', files = { { path = '/e', size = -1 } } }, '')),
    'bad_request', 'a size below 0')
  eq(errorCode(env.call('write_files', { encoding = 'binary', files = {} })), 'bad_request', 'in JSON')
  local many = {}
  for i = 1, lib.MAX_BATCH_FILES + 1 do many[i] = { path = '/m' .. i, size = 0 } end
  eq(errorCode(env.callBinary('write_files', { encoding = 'binary', files = many }, '')), 'bad_request', 'too many')
end)

test('on CraftOS-PC file parts stay base64 in JSON', function()
  local host = rawget(_G, '_HOST')
  rawset(_G, '_HOST', 'ComputerCraft 1.109.2 (CraftOS-PC v2.8.3)')
  local ok, err = pcall(function()
    local env = sandbox()
    eq(lib.hello('7:lab', 'h-1', 'pw').payload.features, { 'write_id', 'move_file', 'make_folder' }, 'features')
    eq(errorCode(env.call('read_file', { path = 'rom', encoding = 'binary' })), 'bad_request', 'binary read')
    local sent = #env.h.sent
    env.callBinary('write_file', { path = '/c.bin', encoding = 'binary' }, 'abc')
    eq({ #env.h.sent, env.craft.fs.files['c.bin'] }, { sent, nil }, 'a binary message is ignored')
  end)
  rawset(_G, '_HOST', host)
  if not ok then error(err, 0) end
end)

test('writing under /rom is fs_error Access denied', function()
  local env = sandbox()
  local frame = env.call('write_file', { path = '/rom/x', content = lib.base64Encode('no'), encoding = 'base64' })
  eq({ frame.ok, frame.error }, { false, { code = 'fs_error', message = '/rom/x: Access denied' } }, 'write')
  eq(env.call('delete_file', { path = 'rom/programs' }).error, { code = 'fs_error', message = '/rom/programs: Access denied' }, 'delete')
  eq(env.craft.fs.files['rom/x'], nil, 'nothing written')
end)

test('out of space fails with fs_error before anything is written', function()
  local env = sandbox({ capacity = 3000 })
  env.craft.fs.put('keep.txt', 'kept')
  local before = env.craft.fs.used()
  -- 2500 would just fit beside the old file (a file counts max(size, 500), as in CC:Tweaked).
  local frame = env.call('write_file', { path = '/keep.txt', content = lib.base64Encode(('y'):rep(2501)), encoding = 'base64' })
  eq(errorCode(frame), 'fs_error', 'fs_error')
  eq(frame.error.message, 'Out of space: writing /keep.txt needs 2501 bytes, 2500 free (/keep.txt is unchanged)', 'message')
  eq(env.craft.fs.files['keep.txt'], 'kept', 'the old file is untouched')
  eq(env.craft.fs.list(''), { 'keep.txt', 'rom' }, 'no temporary file')
  eq(env.craft.fs.used(), before, 'no space used')
  eq(env.craft.fs.opens, 0, 'nothing opened')
  -- A write the precheck lets through but the disk refuses still leaves nothing behind.
  env.craft.fs.getFreeSpace = nil
  frame = env.call('write_file', { path = '/new.txt', content = lib.base64Encode(('y'):rep(2600)), encoding = 'base64' })
  eq(frame.error, { code = 'fs_error', message = 'Out of space' }, 'CraftOS\'s own message')
  eq(env.craft.fs.list(''), { 'keep.txt', 'rom' }, 'still nothing left')
end)

test('read_file windows, limits and errors', function()
  local env = sandbox()
  env.craft.fs.put('f.bin', '0123456789')
  local answer = okPayload(env.call('read_file', { path = 'f.bin', offset = 2, length = 5, encoding = 'base64' }))
  eq({ lib.base64Decode(answer.content), answer.bytesRead, answer.sizeBytes, answer.offset }, { '23456', 5, 10, 2 }, 'a window')
  answer = okPayload(env.call('read_file', { path = 'f.bin', offset = 20 }))
  eq({ answer.content, answer.bytesRead }, { '', 0 }, 'past the end')
  env.craft.fs.put('huge.bin', ('h'):rep(lib.MAX_CONTENT + 10))
  eq(okPayload(env.call('read_file', { path = 'huge.bin', length = 1000000 })).bytesRead, lib.MAX_CONTENT, 'length capped at 64 KiB')
  eq(env.call('read_file', { path = 'missing' }).error, { code = 'fs_error', message = '/missing: No such file' }, 'missing')
  eq(env.call('read_file', { path = 'rom' }).error, { code = 'fs_error', message = '/rom: Is a directory' }, 'a folder')
  eq(errorCode(env.call('read_file', { path = 'f.bin', offset = -1 })), 'bad_request', 'negative offset')
  eq(errorCode(env.call('read_file', { path = 'f.bin', encoding = 'hex' })), 'bad_request', 'other encodings')
  eq(env.craft.fs.opens, env.craft.fs.closes, 'every handle closed once')
end)

test('list_files lists names, types, sizes and readOnly', function()
  local env = sandbox()
  env.craft.fs.put('a.txt', 'abc')
  env.craft.fs.makeDir('sub')
  local answer = okPayload(env.call('list_files', { path = '/' }))
  eq(answer, { path = '/', entries = {
    { name = 'a.txt', type = 'file', size = 3, readOnly = false },
    { name = 'rom', type = 'dir', size = 0, readOnly = true },
    { name = 'sub', type = 'dir', size = 0, readOnly = false },
  } }, 'root')
  eq(okPayload(env.call('list_files', { path = 'sub' })), { path = '/sub', entries = {} }, 'empty folder')
  eq(env.call('list_files', { path = 'a.txt' }).error, { code = 'fs_error', message = '/a.txt: Not a directory' }, 'a file')
  eq(env.call('list_files', { path = 'nope' }).error, { code = 'fs_error', message = '/nope: No such file' }, 'missing')
end)

test('delete_file deletes or says it did not', function()
  local env = sandbox()
  env.craft.fs.put('d/x.txt', 'x')
  eq(okPayload(env.call('delete_file', { path = '/d/x.txt' })), { deleted = true }, 'deleted')
  eq(env.craft.fs.files['d/x.txt'], nil, 'gone')
  eq(okPayload(env.call('delete_file', { path = '/d/x.txt' })), { deleted = false }, 'nothing to delete')
  eq(errorCode(env.call('delete_file', { path = '/' })), 'bad_request', 'not the root')
end)

-- Screen ---------------------------------------------------------------------------

test('screen reads the recorder of the native terminal, installed once, or says why it cannot', function()
  local env = sandbox()
  local native = env.craft.native
  _G.term.setCursorPos(1, 2)
  _G.term.write('hi')
  _G.term.setCursorPos(3, 3)
  local answer = okPayload(env.call('screen', {}))
  eq({ answer.width, answer.height, answer.cursorX, answer.cursorY }, { 30, 6, 3, 3 }, 'size and cursor')
  eq(answer.lines[2], 'hi' .. (' '):rep(28), 'what was drawn, recorded')
  eq(answer.text[2], ('0'):rep(30), 'text colours')
  eq(answer.background[2], ('f'):rep(30), 'background colours')
  eq(native.rows[2], answer.lines[2], 'drawn on the screen as before')
  -- A second daemon (or a reloaded library) reuses it: the methods are wrapped once.
  local recorder = rawget(_G, lib.RECORDER_GLOBAL)
  local write = native.write
  eq(lib.installRecorder(env.craft.term), recorder, 'the same recorder')
  eq(native.write, write, 'not wrapped twice')
  -- No native terminal to record, and no readable terminal: it says so.
  local bare = newSession({ loop = fakeLoop(), term = {}, recorder = false, screen = function() return nil end,
    settings = fakeSettings({ ['sandbox.allow'] = 'screen' }) })
  bare.h, bare.hello = connected(bare)
  local id = lib.newMessageId(bare.os)
  bare.loop.emit('websocket_message', bare.http.lastUrl(), encode(lib.gatewayRequest('7:', id, 'screen', {})), false)
  local frames = bare.h.frames()
  eq(frames[#frames].error, { code = 'internal', message = lib.NO_SCREEN }, 'says why')
end)

test('the recorder mirrors write, blit, clear, clearLine and scroll row by row', function()
  local native = fakeWindow(8, 3)
  local rec = lib.newRecorder(native)
  for name, fn in pairs(rec.wrapped) do native[name] = fn end
  local changed = {}
  local watcher = { rows = {}, poke = function() end }
  rec.watch(watcher)
  native.write('abc')
  native.setCursorPos(2, 2)
  native.blit('xy', '12', '3F')
  eq({ rec.getLine(2) }, { ' xy     ', '012' .. ('0'):rep(5), 'f3f' .. ('f'):rep(5) }, 'blit with its colours')
  for y in pairs(watcher.rows) do changed[#changed + 1] = y end
  table.sort(changed)
  eq(changed, { 1, 2 }, 'the rows drawn on')
  native.scroll(1)
  eq({ (rec.getLine(1)), (rec.getLine(3)) }, { ' xy     ', '        ' }, 'scrolled')
  native.setCursorPos(1, 1)
  native.clearLine()
  eq((rec.getLine(1)), '        ', 'line cleared')
  native.write('z')
  native.clear()
  eq({ (rec.getLine(1)), (rec.getLine(2)) }, { '        ', '        ' }, 'cleared')
  eq(native.rows, { '        ', '        ', '        ' }, 'the screen itself agrees')
  eq(lib.compactRow('ab   ', '00000', 'fffff'), { line = 'ab ', text = '0', background = 'f' }, 'compact row')
end)

local UUID = '0f8fad5b-d9cb-469f-a165-70867728950e' -- a gateway messageId's length

test('screen_watch sends the whole screen, then changed rows at most maxFps a second, nothing while idle', function()
  local env = sandbox()
  local id = env.ask('screen_watch', { maxFps = 5 }, UUID)
  local _, partials = env.answers(id)
  eq(#partials, 1, 'the first frame at once')
  local first = partials[1].payload
  eq({ first.type, first.width, first.height, first.cursorBlink }, { 'screen', 30, 6, false }, 'header')
  local rows = 0
  for _ in pairs(first.rows) do rows = rows + 1 end
  eq(rows, 6, 'every row')
  eq(#first.palette, 16, 'the palette')
  eq(env.loop.pending(), 0, 'idle: no timer armed')
  env.loop.advance(5)
  eq(#select(2, env.answers(id)), 1, 'idle: nothing sent')
  _G.term.setCursorPos(1, 3)
  _G.term.write('> sandbox health')
  _G.term.setCursorPos(1, 4)
  _G.term.write('sandboxOk: true')
  env.loop.advance(0)
  _, partials = env.answers(id)
  eq(#partials, 2, 'one frame for both writes')
  eq(partials[2].payload, { type = 'screen', cursorX = 16, cursorY = 4, rows = {
    ['3'] = { line = '> sandbox health ', text = '0', background = 'f' },
    ['4'] = { line = 'sandboxOk: true ', text = '0', background = 'f' } } }, 'only the changed rows')
  _G.term.write('!')
  env.loop.advance(0.1)
  eq(#select(2, env.answers(id)), 2, 'not before 1/maxFps s')
  env.loop.advance(0.15)
  _, partials = env.answers(id)
  eq(#partials, 3, 'then the change')
  -- One row change of a typical line costs at most 300 bytes on the wire.
  local sent = env.h.sent[#env.h.sent]
  truthy(#sent <= 300, 'one row: ' .. #sent .. ' bytes: ' .. sent)
  eq(env.loop.pending(), 0, 'idle again: no timer armed')
  if rawget(_G, 'io') and io.stdout then io.stdout:write(('screen_watch: one row change is %d bytes on the wire\n'):format(#sent)) end
  -- Cancel ends it; so does the end of the connection.
  eq(okPayload(env.call('cancel', { messageId = id })), { cancelled = true }, 'cancelled')
  eq(errorCode(env.final(id)), 'cancelled', 'the watch ends cancelled')
  _G.term.write('after')
  env.loop.advance(1)
  eq(#select(2, env.answers(id)), 3, 'nothing after the end')
  local second = env.ask('screen_watch', {})
  env.loop.emit('websocket_closed', env.http.lastUrl())
  _G.term.write('gone')
  env.loop.advance(1)
  eq(#select(2, env.answers(second)), 1, 'the connection ended the watch')
  eq(env.session.status().watches, 0, 'no watch left')
end)

test('input checks every event first, then queues them in order in batches', function()
  local env = sandbox()
  rawset(_G, 'keys', { enter = 257, a = 65, getName = function() end })
  local function queued()
    local list = {}
    for _, e in ipairs(env.os.queued) do list[#list + 1] = { table.unpack(e, 1, e.n) } end
    return list
  end
  env.os.queued = {}
  local bad = env.call('input', { events = { { char = 'a' }, { key = 'enter' }, { key = 'nope' } } })
  eq(errorCode(bad), 'bad_request', 'an unknown key name')
  truthy(bad.error.message:find('events[2]', 1, true), 'names the event: ' .. bad.error.message)
  eq(errorCode(env.call('input', { events = { { char = 'ab' } } })), 'bad_request', 'char is one character')
  eq(errorCode(env.call('input', { events = { { mouseClick = { button = 1, x = 2 } } } })), 'bad_request', 'mouse needs x and y')
  eq(errorCode(env.call('input', { events = { { fly = true } } })), 'bad_request', 'an unknown kind')
  local many = {}
  for i = 1, 257 do many[i] = { char = 'a' } end
  eq(errorCode(env.call('input', { events = many })), 'bad_request', 'at most 256')
  env.loop.advance(0)
  eq(queued(), {}, 'nothing queued by a bad request')
  local id = env.ask('input', { events = {
    { char = 'h' }, { key = 'enter', held = true }, { keyUp = 'enter' }, { paste = 'pasted' }, { terminate = true },
    { mouseClick = { button = 2, x = 3, y = 4 } }, { mouseUp = { button = 2, x = 3, y = 4 } },
    { mouseScroll = { direction = -1, x = 5, y = 6 } } } })
  eq(queued(), { { 'char', 'h' }, { 'key', 257, true }, { 'key_up', 257 }, { 'paste', 'pasted' }, { 'terminate' },
    { 'mouse_click', 2, 3, 4 }, { 'mouse_up', 2, 3, 4 }, { 'mouse_scroll', -1, 5, 6 } }, 'in order, as CraftOS events')
  eq(okPayload(env.final(id)), { queued = 8 }, 'answered')
  -- 100 events: 32 at a time, the next batch once a 0 s timer (queued behind them) fires.
  env.os.queued = {}
  many = {}
  for i = 1, 100 do many[i] = { char = string.char(32 + i % 90) } end
  id = env.ask('input', { events = many })
  eq(#env.os.queued, lib.INPUT_BATCH, 'the first batch')
  eq(env.answers(id), nil, 'no answer before the last batch')
  env.loop.advance(0)
  eq(#env.os.queued, 100, 'all queued')
  for i = 1, 100 do if env.os.queued[i][2] ~= many[i].char then error('out of order at ' .. i) end end
  eq(okPayload(env.final(id)), { queued = 100 }, 'answered once all are queued')
end)

test('the built-in event loop hands terminate to its handlers and keeps running', function()
  local events = { { 'terminate' }, { 'char', 'x' } }
  local osLike = {
    pullEventRaw = function() return table.unpack(table.remove(events, 1)) end,
    pullEvent = function() error('Terminated', 0) end,
    startTimer = function() return 1 end,
  }
  local loop = lib.createEventLoop(osLike)
  local seen = {}
  loop.register('terminate', function() seen[#seen + 1] = 'terminate' end)
  loop.register('char', function(c) seen[#seen + 1] = c; loop.stop() end)
  loop.run()
  eq(seen, { 'terminate', 'x' }, 'terminate handled, the loop went on')
end)

-- sandbox ask (SPEC §11) --------------------------------------------------------

local function wrapTo(width, column)
  local lines, current = {}, ''
  local w = lib.newWrapper(width,
    function(s) current = current .. s end,
    function() lines[#lines + 1] = current; current = '' end,
    column)
  return w, function() local all = {}; for i, l in ipairs(lines) do all[i] = l end; all[#all + 1] = current; return all end
end

test('newWrapper wraps words to the width and keeps a word split across deltas whole', function()
  local w, screen = wrapTo(10)
  w.text('hello wor'); w.text('ld, this is'); w.text(' wrapped\nnext')
  w.flush()
  eq(screen(), { 'hello', 'world,', 'this is', 'wrapped', 'next' }, 'lines')
  for _, l in ipairs(screen()) do truthy(#l <= 10, 'line within width: ' .. l) end
end)

test('newWrapper breaks a word longer than the line and starts at the cursor column', function()
  local w, screen = wrapTo(5, 3)
  w.text('ab abcdefghijkl x')
  w.flush()
  eq(screen(), { 'ab', 'abcde', 'fghij', 'kl x' }, 'lines')
  local l, lines = lib.newWrapper(4, function() end, function() end), nil
  l.line('[write_file]')
  eq(l.col, 0, 'a line ends at column 0')
end)

test('onMessage queues a partial gateway_response as trapos_sandbox_partial', function()
  local ctx = msgCtx()
  eq(lib.onMessage('{"event":"gateway_response","traposReceiverId":"7:t","messageId":"m-1","type":"ask","ok":true,"partial":true,"payload":{"type":"text_delta","text":"hi"}}', ctx), 'partial', 'result')
  eq(#ctx.queued, 1, 'one event')
  eq({ ctx.queued[1][1], ctx.queued[1][2], ctx.queued[1][3] }, { 'trapos_sandbox_partial', 'm-1', { type = 'text_delta', text = 'hi' } }, 'the partial event')
end)

local function askScript(script)
  local p = scriptedEvents(script)
  p.printed = {}
  p.print = function(s) p.printed[#p.printed + 1] = s end
  local w, screen = wrapTo(20)
  p.out = w
  p.screen = screen
  return p
end

local function partial(payload)
  return function(s) return { 'trapos_sandbox_partial', s.queued[1][2], payload, n = 3 } end
end

test('ask prints deltas, a line per tool, asks permission and restarts its timer on partials', function()
  local p = askScript({
    partial({ type = 'text_delta', text = 'I will write ' }),
    partial({ type = 'text_delta', text = 'the file.' }),
    partial({ type = 'permission', id = 'per_1', tool = 'trapsandbox_write_file', detail = '/hello.lua' }),
    { 'char', 'y' },
    partial({ type = 'tool', name = 'trapsandbox_write_file', status = 'running' }),
    partial({ type = 'tool', name = 'trapsandbox_write_file', status = 'completed' }),
    partial({ type = 'text_delta', text = ' Done.' }),
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], true, { sessionId = 'ses_1', text = 'x' }, n = 5 } end,
  })
  p.yes = false
  local ok, answer = lib.ask('write hello', p)
  eq(ok, true, 'ok')
  eq(answer.sessionId, 'ses_1', 'final answer')
  eq({ p.queued[1][1], p.queued[1][3], p.queued[1][4] }, { 'trapos_sandbox_send', 'ask', { prompt = 'write hello', new = false, yes = false } }, 'the ask')
  eq({ p.queued[2][3], p.queued[2][4] }, { 'ask_permission', { permissionId = 'per_1', response = 'once' } }, 'the permission answer')
  eq(p.screen(), { 'I will write the', 'file.', 'Allow write_file:', '/hello.lua?', '[y] once [a] always', '[n] no', '> allowed (once)', '[write_file]', 'Done.' }, 'screen')
  eq(#p.timers, 7, 'the first timer and a fresh one per partial')
  eq(p.timers[1], lib.ASK_IDLE_TIMEOUT, 'idle timeout')
end)

test('ask: n refuses, and Ctrl+T sends cancel and waits for the final answer', function()
  local p = askScript({
    partial({ type = 'permission', id = 'per_2', tool = 'trapsandbox_run_command', detail = 'rm /x' }),
    { 'char', 'q' },
    { 'char', 'n' },
    { 'terminate' },
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], false, nil, { code = 'cancelled', message = 'cancelled: the agent was stopped' }, n = 5 } end,
  })
  local ok, err = lib.ask('do it', p)
  eq(ok, false, 'not ok')
  eq(err.code, 'cancelled', 'cancelled')
  eq({ p.queued[2][3], p.queued[2][4] }, { 'ask_permission', { permissionId = 'per_2', response = 'reject' } }, 'refused')
  eq({ p.queued[3][3], p.queued[3][4] }, { 'cancel', { messageId = p.queued[1][2] } }, 'cancel names the ask')
  eq(p.timers[#p.timers], lib.ASK_CANCEL_WAIT, 'waits a while after cancel')
  local shown = table.concat(p.screen(), ' ')
  truthy(shown:find('> refused', 1, true) and shown:find('Cancelling', 1, true), shown)
end)

test('ask: a second Ctrl+T gives up at once; silence times out', function()
  local p = askScript({ { 'terminate' }, { 'terminate' } })
  local ok, err = lib.ask('x', p)
  eq({ ok, err.code }, { false, 'cancelled' }, 'gave up')
  local q = askScript({ { 'timer', 999 }, { 'timer', 101 } })
  q.timeout = 5
  local ok2, err2 = lib.ask('x', q)
  eq({ ok2, err2.code }, { false, 'timeout' }, 'timed out')
end)

test('ask: a waiting ask says how many are ahead, once per change, and can be cancelled', function()
  local p = askScript({
    partial({ type = 'waiting', ahead = 2 }),
    partial({ type = 'waiting', ahead = 2 }),
    partial({ type = 'waiting', ahead = 1 }),
    partial({ type = 'waiting', ahead = 0 }),
    { 'terminate' },
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], false, nil, { code = 'cancelled', message = 'cancelled while waiting for the agent' }, n = 5 } end,
  })
  local ok, err = lib.ask('x', p)
  eq({ ok, err.code }, { false, 'cancelled' }, 'cancelled')
  eq({ p.queued[2][3], p.queued[2][4] }, { 'cancel', { messageId = p.queued[1][2] } }, 'cancel names the ask')
  local shown = table.concat(p.screen(), ' ')
  eq(select(2, shown:gsub('2 asks ahead', '')), 1, 'unchanged: shown once: ' .. shown)
  truthy(shown:find('waiting for the agent: 1 ask ahead', 1, true), shown)
  truthy(shown:find('next in line', 1, true), shown)
  eq(#p.timers, 6, 'every partial restarts the idle timer, the cancel waits')
end)

test('ask prints the final text when no delta arrived', function()
  local p = askScript({
    function(s) return { 'trapos_sandbox_reply', s.queued[1][2], true, { sessionId = 's', text = 'All done here.' }, n = 5 } end,
  })
  lib.ask('x', p)
  eq(p.screen(), { 'All done here.' }, 'screen')
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
  runCleanups()
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
