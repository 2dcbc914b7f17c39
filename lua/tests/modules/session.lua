local _VERSION = '0.1.0'

-- Unit tests for sandbox/session.lua (with every module before it, none after): the daemon's
-- one WebSocket on fakes (tests/fakes.lua): connect, hello, the terminal errors, backoff.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises
local fakes = kit.fakes

local MODULES = { 'core', 'consent', 'encoding', 'wire', 'loop', 'capture', 'screen', 'jobs',
  'handlers', 'exec', 'files', 'snapshot', 'console', 'peripherals', 'requests', 'dispatch', 'session' }

-- A started session on fakes; random() is 0 so backoff delays are exact.
local function start(extra)
  local M = kit.modules(table.unpack(MODULES))
  local env = { M = M, os = fakes.os('lab'), loop = fakes.loop(), http = fakes.http(), state = {} }
  local opts = {
    url = 'ws://gw.test/gateway', secret = 's3cret', http = env.http, eventLoop = env.loop,
    os = env.os, encode = fakes.encode, decode = fakes.decode, random = function() return 0 end,
    state = env.state, log = function() end, recorder = false,
  }
  for k, v in pairs(extra or {}) do opts[k] = v end
  env.session = M.startSession(opts)
  return env
end

-- Opens the current attempt: its handle and the hello sent on it.
local function open(env)
  local h = fakes.handle()
  env.loop.emit('websocket_success', env.http.lastUrl(), h)
  return h, h.last()
end

local function answerHello(env, hello, ok)
  local frame = { event = 'gateway_response', traposReceiverId = '7:lab', messageId = hello.messageId, type = 'hello', ok = ok }
  if ok then frame.payload = { accountId = 'local' } else frame.error = { code = 'unauthorized', message = 'bad secret' } end
  env.loop.emit('websocket_message', env.http.lastUrl(), fakes.encode(frame), false)
end

test('a session connects with a nonce and says hello with its secret', function()
  local env = start()
  eq(#env.http.urls, 1, 'one attempt')
  truthy(env.http.urls[1]:find('^ws://gw%.test/gateway%?n=.+'), env.http.urls[1])
  eq(env.session.state(), 'connecting', 'connecting')
  local _, hello = open(env)
  eq({ hello.type, hello.traposSenderId, hello.payload.secret }, { 'hello', '7:lab', 's3cret' }, 'hello')
  eq(env.session.state(), 'handshaking', 'handshaking')
  answerHello(env, hello, true)
  eq(env.session.isReady(), true, 'ready')
  eq(env.os.take(env.M.EVENT_CONNECTED)[2], '7:lab', 'connected queued')
  eq(env.state.accountId, 'local', 'published')
end)

test('startSession checks its options with cc.expect', function()
  local M = kit.modules(table.unpack(MODULES))
  local http = fakes.http()
  raises(function() M.startSession('ws://gw.test') end,
    'bad argument #1 .-%(table expected, got string%)', 'options')
  raises(function() M.startSession({ url = 'ws://gw.test', secret = 7, http = http }) end,
    '^[^:]*modules/session%.lua:%d+: bad field \'secret\' %(string expected, got number%)$',
    'a secret is a string')
  eq(#http.urls, 0, 'nothing connects')
end)

test('an unauthorized hello stops the session for good', function()
  local env = start()
  local h, hello = open(env)
  answerHello(env, hello, false)
  eq(env.session.state(), 'stopped', 'stopped')
  eq(env.session.lastError().code, 'unauthorized', 'why')
  eq(h.closes, 1, 'closed once')
  env.loop.advance(300)
  eq(#env.http.urls, 1, 'never reconnects')
end)

test('reconnect delays double from 1 s up to 30 s', function()
  local env = start({ connectTimeout = 1000 })
  local delays = {}
  for _ = 1, 7 do
    env.loop.emit('websocket_failure', env.http.lastUrl(), 'refused')
    delays[#delays + 1] = env.loop.delays[#env.loop.delays]
    env.loop.advance(delays[#delays])
  end
  eq(delays, { 1, 2, 4, 8, 16, 30, 30 }, 'delays')
  eq(#env.http.urls, 8, 'an attempt after each')
end)

test('a gateway request is answered on the socket once ready', function()
  local env = start()
  local h, hello = open(env)
  answerHello(env, hello, true)
  local request = env.M.gatewayRequest('7:lab', 'g-1', 'ping', {})
  env.loop.emit('websocket_message', env.http.lastUrl(), fakes.encode(request), false)
  local answer = h.last()
  eq({ answer.event, answer.messageId, answer.ok }, { 'computer_response', 'g-1', true }, 'answered')
  eq(answer.payload.traposId, '7:lab', 'ping')
end)

return kit.suite()
