local _VERSION = '0.1.0'

--[[
libsandbox: the computer side of the trapsandbox gateway protocol (SPEC §2, §6).

Loading: this file returns its module table, so it works with `require('libsandbox')`
(when /apis is on package.path, as under trapos) and with `dofile('/apis/libsandbox.lua')`
(plain CraftOS). The sandbox program and daemon try `require` first and fall back to the
known file locations; see `locate` at the end of each of them.

OS events (all prefixed `trapos_sandbox_`):
  trapos_sandbox_send(messageId, type, payload)        a program asks the daemon to send
  trapos_sandbox_reply(messageId, ok, payload, error)  the daemon hands back the answer
  trapos_sandbox_connected(traposId)                   the hello handshake succeeded

Daemon state is published in the shared table `_G.traposSandboxState` (`state`, `connected`,
`traposId`, `url`, `lastError`, `accountId`, `version`, `updated`) so `sandbox status` can read
it without a round trip. A stopped daemon leaves its last state behind, marked `running = false`.

Event loop interface (trapos's `_G.bootEventLoop`, or `createEventLoop()` on plain CraftOS):
  register(event, handler) -> dispose()
  setTimeout(fn, seconds)  -> clear()
Handlers are called with the event's parameters; a loop that also passes the event name
first is detected and handled.
]]

local M = {
  _VERSION = _VERSION,
  EVENT_SEND = 'trapos_sandbox_send',
  EVENT_REPLY = 'trapos_sandbox_reply',
  EVENT_CONNECTED = 'trapos_sandbox_connected',
  HELLO_TIMEOUT = 10,
  CONNECT_TIMEOUT = 30,
  REQUEST_TIMEOUT = 10,
  BACKOFF_MIN = 1,
  BACKOFF_MAX = 30,
  BACKOFF_JITTER = 0.2,
  MAX_FRAME = 1024 * 1024,
  -- Program requests remembered so a dropped connection can answer them (not_connected).
  MAX_IN_FLIGHT = 256,
  CLOSE_REPLACED = 4000,
  CLOSE_UNAUTHORIZED = 4001,
}

local function expect(n, value, ...)
  local t = type(value)
  local names = { ... }
  for i = 1, #names do
    if t == names[i] then return value end
  end
  error(('bad argument #%d (%s expected, got %s)'):format(n, table.concat(names, ' or '), t), 3)
end

local function expectNonEmpty(n, value)
  if type(value) ~= 'string' or value == '' then
    error(('bad argument #%d (non-empty string expected, got %s)'):format(n, type(value) == 'string' and 'empty string' or type(value)), 3)
  end
  return value
end

local function errorValue(code, message)
  return { code = code, message = message }
end
M.errorValue = errorValue

-- The settings the daemon and the `sandbox` command read, with descriptions for `set`.
function M.defineSettings()
  if not (settings and settings.define) then return end
  settings.define('sandbox.url', {
    description = 'WebSocket URL of the trapsandbox gateway, e.g. ws://host:4444/gateway',
    type = 'string',
  })
  settings.define('sandbox.password', {
    description = 'Shared secret the sandbox daemon presents to the gateway (SANDBOX_PASSWORD)',
    type = 'string',
  })
end

-- traposId = "<computerId>:<label>", label may be empty ("7:").
function M.traposId(osLike)
  osLike = osLike or os
  expect(1, osLike, 'table')
  local id = osLike.getComputerID()
  local label = osLike.getComputerLabel and osLike.getComputerLabel() or nil
  return ('%d:%s'):format(id, label or '')
end

-- A JSON object decodes to a table with only string keys. Anything else (missing, `[]` which
-- CraftOS decodes to the frozen `textutils.empty_json_array`, a list, a scalar) reads as {}.
-- Always returns a table the caller may modify.
function M.coercePayload(payload)
  if type(payload) ~= 'table' then return {} end
  if next(payload) == nil then return {} end
  for k in pairs(payload) do
    if type(k) ~= 'string' then return {} end
  end
  return payload
end

function M.coerceError(err, fallbackMessage)
  if type(err) == 'table' and type(err.code) == 'string' and err.code ~= '' then
    return errorValue(err.code, type(err.message) == 'string' and err.message or '')
  end
  return errorValue('internal', fallbackMessage or 'request failed without an error')
end

-- Envelope builders ---------------------------------------------------------

-- The four events differ only in their name and in which side's traposId they carry.
-- The builders tail-call these, so argument errors still name the builder's caller.
local function requestFrame(event, idKey, id, messageId, msgType, payload)
  expectNonEmpty(1, id)
  expectNonEmpty(2, messageId)
  expectNonEmpty(3, msgType)
  expect(4, payload, 'table', 'nil')
  return {
    event = event, [idKey] = id, messageId = messageId, type = msgType,
    payload = M.coercePayload(payload),
  }
end

local function responseFrame(event, idKey, id, messageId, msgType, ok, payload, err)
  expectNonEmpty(1, id)
  expectNonEmpty(2, messageId)
  expectNonEmpty(3, msgType)
  expect(4, ok, 'boolean')
  local frame = { event = event, [idKey] = id, messageId = messageId, type = msgType, ok = ok }
  if ok then frame.payload = M.coercePayload(payload) else frame.error = M.coerceError(err) end
  return frame
end

function M.computerRequest(senderId, messageId, msgType, payload)
  return requestFrame('computer_request', 'traposSenderId', senderId, messageId, msgType, payload)
end

function M.computerResponse(senderId, messageId, msgType, ok, payload, err)
  return responseFrame('computer_response', 'traposSenderId', senderId, messageId, msgType, ok, payload, err)
end

function M.gatewayRequest(receiverId, messageId, msgType, payload)
  return requestFrame('gateway_request', 'traposReceiverId', receiverId, messageId, msgType, payload)
end

function M.gatewayResponse(receiverId, messageId, msgType, ok, payload, err)
  return responseFrame('gateway_response', 'traposReceiverId', receiverId, messageId, msgType, ok, payload, err)
end

function M.hello(senderId, messageId, secret, version)
  expectNonEmpty(1, senderId)
  expect(3, secret, 'string', 'nil')
  return M.computerRequest(senderId, messageId, 'hello', {
    traposId = senderId,
    secret = secret or '',
    version = version or _VERSION,
    capabilities = { 'ping' },
  })
end

-- messageId = "<os.epoch('utc')>-<process-global sequence>"; the sequence lives in _G so
-- concurrent programs sharing one computer never mint the same id.
function M.newMessageId(osLike)
  osLike = osLike or os
  local seq = (rawget(_G, 'traposSandboxSeq') or 0) + 1
  rawset(_G, 'traposSandboxSeq', seq)
  local epoch = osLike.epoch and osLike.epoch('utc') or 0
  return ('%.0f-%d'):format(epoch, seq)
end

-- Adds a fresh nonce to a URL's query so websocket_* events of different attempts differ.
function M.withNonce(url, nonce)
  expect(1, url, 'string')
  local sep = url:find('?', 1, true) and '&' or '?'
  return url .. sep .. 'n=' .. tostring(nonce)
end

local function defaultEncode(value)
  return textutils.serializeJSON(value)
end

local function defaultDecode(text)
  return textutils.unserializeJSON(text)
end

-- Gateway requests: the dispatch table ------------------------------------------

--[[ M.requestHandlers: gateway request type -> handler(req, ctx).
req = { messageId, type, payload (coerced), respond(ok, payload, err) -> sent }
ctx = the context onMessage was given (traposId, send, ... and, in a session, `session`).
A handler answers through req.respond, at once or later. A handler that raises is answered
with `internal`; a type missing here is answered with `unknown_type`. ]]
M.requestHandlers = {}

function M.requestHandlers.ping(req, ctx)
  req.respond(true, { traposId = ctx.traposId })
end

local function encodeFor(ctx)
  return ctx.encode or defaultEncode
end

-- Builds the request object handed to a handler; its answer goes out through ctx.send.
local function newRequest(ctx, messageId, msgType, payload)
  local req = { messageId = messageId, type = msgType, payload = M.coercePayload(payload), answered = false }
  function req.respond(ok, answer, err)
    if req.answered then return false end
    req.answered = true
    local okEncode, text = pcall(encodeFor(ctx), M.computerResponse(ctx.traposId, messageId, msgType, ok, answer, err))
    if not okEncode or type(text) ~= 'string' or text == '' then return false end
    return ctx.send(text) and true or false
  end
  return req
end

local function dispatchRequest(ctx, messageId, msgType, payload)
  local handlers = ctx.handlers or M.requestHandlers
  local handler = handlers[msgType]
  local req = newRequest(ctx, messageId, msgType, payload)
  if type(handler) ~= 'function' then
    req.respond(false, nil, errorValue('unknown_type', 'unknown request type: ' .. msgType))
    return 'unknown_type'
  end
  local ok, err = pcall(handler, req, ctx)
  if not ok and not req.answered then
    req.respond(false, nil, errorValue('internal', tostring(err)))
  end
  return msgType
end

--[[ onMessage(content, ctx): handle one text frame from the gateway.
ctx = { traposId, send(text) -> ok, queueEvent(...), decode?, encode?, handlers?,
        onHello(messageId, ok, payload, error)?, onReply(messageId) -> consumed? }
Returns what it did: the request type it dispatched (e.g. 'ping'), 'unknown_type', 'hello',
'reply' or 'ignored'. Never raises. ]]
function M.onMessage(content, ctx)
  expect(2, ctx, 'table')
  if type(content) ~= 'string' or content == '' then return 'ignored' end
  local decode = ctx.decode or defaultDecode
  local okDecode, frame = pcall(decode, content)
  if not okDecode or type(frame) ~= 'table' then return 'ignored' end
  local event, messageId, msgType = frame.event, frame.messageId, frame.type
  if type(messageId) ~= 'string' or messageId == '' or type(msgType) ~= 'string' or msgType == '' then
    return 'ignored'
  end

  if event == 'gateway_request' then
    return dispatchRequest(ctx, messageId, msgType, frame.payload)

  elseif event == 'gateway_response' then
    local ok = frame.ok == true
    local payload, err
    if ok then payload = M.coercePayload(frame.payload) else err = M.coerceError(frame.error) end
    if msgType == 'hello' then
      if ctx.onHello then ctx.onHello(messageId, ok, payload, err) end
      return 'hello'
    end
    -- An answer to the daemon's own request is consumed; others go to the program waiting.
    if ctx.onReply and ctx.onReply(messageId, ok, payload, err) == true then return 'reply' end
    ctx.queueEvent(M.EVENT_REPLY, messageId, ok, payload, err)
    return 'reply'
  end
  return 'ignored'
end

-- Built-in event loop for plain CraftOS: the same interface as trapos's bootEventLoop.
function M.createEventLoop(osLike)
  osLike = osLike or os
  local handlers = {}
  local timers = {}
  local running = false
  local loop = {}

  function loop.register(event, handler)
    expect(1, event, 'string')
    expect(2, handler, 'function')
    local list = handlers[event]
    if not list then list = {}; handlers[event] = list end
    local entry = { fn = handler }
    list[#list + 1] = entry
    return function()
      for i = #list, 1, -1 do
        if list[i] == entry then table.remove(list, i) end
      end
    end
  end

  function loop.setTimeout(fn, seconds)
    expect(1, fn, 'function')
    expect(2, seconds, 'number')
    local id = osLike.startTimer(seconds)
    timers[id] = fn
    return function()
      if timers[id] then
        timers[id] = nil
        if osLike.cancelTimer then pcall(osLike.cancelTimer, id) end
      end
    end
  end

  function loop.dispatch(event, ...)
    if event == 'timer' then
      local id = ...
      local fn = timers[id]
      if fn then
        timers[id] = nil
        fn()
      end
    end
    local list = handlers[event]
    if list then
      local snapshot = {}
      for i = 1, #list do snapshot[i] = list[i] end
      for i = 1, #snapshot do snapshot[i].fn(...) end
    end
  end

  function loop.run()
    running = true
    while running do
      loop.dispatch(osLike.pullEvent())
    end
  end

  function loop.stop()
    running = false
  end

  return loop
end

local function dropEventName(name, ...)
  if select('#', ...) > 0 and (select(1, ...)) == name then
    return select(2, ...)
  end
  return ...
end

-- The session (the daemon) ---------------------------------------------------------

--[[ A session moves through these states (`session.state()`):
  connecting   websocketAsync called, waiting for websocket_success (connectTimeout)
  handshaking  hello sent, waiting for its answer (helloTimeout)
  ready        hello answered ok: program requests are forwarded, gateway requests answered
  waiting      the attempt failed; a reconnect is scheduled (backoff)
  stopped      for good: unauthorized, replaced, or stop() was called
Every recoverable failure goes through one transition, `fail(err)`: record the error, end the
attempt (timers cleared, handle closed once, pending sends failed) and schedule a reconnect.
`stopForGood(err)` is the terminal one. Gateway requests go to M.requestHandlers through
onMessage; the connection code knows nothing about them. ]]
local Session = {}
Session.__index = Session

function Session:publish()
  local published = self.published
  if not published then return end
  published.running = not self.stopped
  published.state = self.state
  published.connected = self.state == 'ready'
  published.traposId = self.traposId
  published.url = self.baseUrl
  published.lastError = self.lastError
  published.accountId = self.accountId
  published.version = _VERSION
  published.updated = self.os.epoch and self.os.epoch('utc') or nil
end

function Session:queue(...)
  local ok, err = pcall(self.os.queueEvent, ...)
  if not ok then self.log('queueEvent failed: ' .. tostring(err)) end
end

function Session:reply(messageId, err)
  self:queue(M.EVENT_REPLY, messageId, false, nil, err)
end

function Session:closeHandle(handle)
  if handle == nil or self.closedHandles[handle] then return end
  self.closedHandles[handle] = true
  local ok, err = pcall(handle.close)
  if not ok then self.log('close failed: ' .. tostring(err)) end
end

function Session:sendOn(handle, text)
  if handle == nil or self.closedHandles[handle] then return false, 'connection closed' end
  if type(text) ~= 'string' or text == '' then return false, 'refusing to send an empty message' end
  local ok, err = pcall(handle.send, text)
  if not ok then return false, tostring(err) end
  return true
end

function Session:failInFlight(message)
  local ids = self.inFlight
  self.inFlight, self.inFlightCount = {}, 0
  for id in pairs(ids) do
    self:reply(id, errorValue('not_connected', message))
  end
end

local function clearAttemptTimers(attempt)
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
end

-- Ends the current attempt: timers cleared, handle closed once, pending sends failed.
function Session:endAttempt(message)
  local attempt = self.current
  if not attempt or attempt.done then return end
  attempt.done = true
  clearAttemptTimers(attempt)
  self:closeHandle(attempt.handle)
  self:failInFlight(message or 'connection lost')
end

function Session:clearReconnect()
  if self.cancelReconnect then self.cancelReconnect(); self.cancelReconnect = nil end
end

function Session:scheduleReconnect()
  if self.terminal or self.stopped then return end
  self.failures = self.failures + 1
  local base = self.backoffMin
  for _ = 2, self.failures do
    base = base * 2
    if base >= self.backoffMax then base = self.backoffMax; break end
  end
  if base > self.backoffMax then base = self.backoffMax end
  local delay = base * (1 - self.backoffJitter * self.random())
  self.state = 'waiting'
  self:publish()
  self.log(('reconnecting in %.1f s'):format(delay))
  self:clearReconnect()
  self.cancelReconnect = self.loop.setTimeout(function()
    self.cancelReconnect = nil
    self:connect()
  end, delay)
end

-- The one transition for every recoverable failure.
function Session:fail(err)
  self.lastError = err
  self:endAttempt(err.message)
  self:scheduleReconnect()
end

function Session:stopForGood(err)
  self.terminal = true
  self.lastError = err
  self:endAttempt(err.code .. ': ' .. (err.message or ''))
  self:clearReconnect()
  self.state = 'stopped'
  self:publish()
  self.log('stopped: ' .. err.code .. ' ' .. (err.message or ''))
end

function Session:isCurrent(url)
  local attempt = self.current
  return attempt ~= nil and not attempt.done and url == attempt.url
end

-- Arms a timer that fails the attempt if it is still in `state` when it fires.
function Session:deadline(attempt, state, seconds, makeError)
  return self.loop.setTimeout(function()
    if self.current == attempt and not attempt.done and self.state == state then
      self:fail(makeError())
    end
  end, seconds)
end

-- connecting ----------------------------------------------------------------------

function Session:connect()
  if self.terminal or self.stopped then return end
  self.attempts = self.attempts + 1
  local nonce = ('%.0f-%d-%d'):format(self.os.epoch and self.os.epoch('utc') or 0, self.attempts,
    math.floor(self.random() * 1000000))
  local attempt = { url = M.withNonce(self.baseUrl, nonce) }
  self.current = attempt
  self.state = 'connecting'
  self:publish()
  attempt.clearConnect = self:deadline(attempt, 'connecting', self.connectTimeout, function()
    return errorValue('not_connected', 'connection attempt timed out')
  end)
  local ok, result, err = pcall(self.http.websocketAsync, attempt.url, self.headers)
  if not ok or result == false then
    -- CC:Tweaked may also queue websocket_failure for this URL; the attempt is done by then.
    self:fail(errorValue('not_connected', tostring(ok and (err or 'websocket refused') or result)))
  end
end

-- connecting -> handshaking: the socket is open, send hello.
function Session:onOpen(url, handle)
  local attempt = self.current
  if not self:isCurrent(url) or attempt.handle then
    -- A late success for an abandoned attempt: nobody will use it, free the slot.
    if type(handle) == 'table' and not (attempt and attempt.handle == handle) then self:closeHandle(handle) end
    return
  end
  attempt.handle = handle
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
  self.state = 'handshaking'
  self:publish()
  attempt.helloId = M.newMessageId(self.os)
  local okEncode, text = pcall(self.encode, M.hello(self.traposId, attempt.helloId, self.secret, _VERSION))
  local sent, sendErr = false, text
  if okEncode then sent, sendErr = self:sendOn(handle, text) end
  if not sent then
    self:fail(errorValue('not_connected', 'could not send hello: ' .. tostring(sendErr)))
    return
  end
  attempt.clearHello = self:deadline(attempt, 'handshaking', self.helloTimeout, function()
    return errorValue('timeout', ('no hello answer within %d s'):format(self.helloTimeout))
  end)
end

-- handshaking -> ready, stopped (unauthorized) or waiting.
function Session:onHello(messageId, ok, payload, err)
  local attempt = self.current
  if self.state ~= 'handshaking' or not attempt or attempt.done or messageId ~= attempt.helloId then return end
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if ok then
    self.state = 'ready'
    self.failures = 0
    self.lastError = nil
    self.accountId = payload and payload.accountId or nil
    self:publish()
    self.log('connected as ' .. self.traposId)
    self:queue(M.EVENT_CONNECTED, self.traposId)
  elseif err and err.code == 'unauthorized' then
    self:stopForGood(err)
  else
    self:fail(err or errorValue('internal', 'hello failed'))
  end
end

-- Any state: the socket failed or closed.
function Session:onFailure(url, err)
  if not self:isCurrent(url) then return end
  self:fail(errorValue('not_connected', 'connection failed: ' .. tostring(err or 'unknown error')))
end

function Session:onClosed(url, reason, code)
  if not self:isCurrent(url) then return end
  local attempt = self.current
  -- The socket is gone: make sure we never call close() on it afterwards.
  if attempt.handle then self.closedHandles[attempt.handle] = true end
  local detail = (type(reason) == 'string' and reason ~= '') and reason or nil
  if code == M.CLOSE_REPLACED then
    self:stopForGood(errorValue('replaced', detail or 'replaced by a newer connection with the same traposId'))
    return
  end
  if code == M.CLOSE_UNAUTHORIZED then
    self:stopForGood(errorValue('unauthorized', detail or 'the gateway rejected the password'))
    return
  end
  local message = 'connection closed'
  if code then message = message .. ' (' .. tostring(code) .. (detail and (' ' .. detail) or '') .. ')' end
  self:fail(errorValue('not_connected', message))
end

-- handshaking and ready: a frame from the gateway.
function Session:onFrame(url, content, isBinary)
  local attempt = self.current
  if not self:isCurrent(url) or not attempt.handle or isBinary then return end
  if not attempt.ctx then
    local handle = attempt.handle
    attempt.ctx = {
      traposId = self.traposId,
      session = self,
      encode = self.encode,
      decode = self.decode,
      send = function(text) return self:sendOn(handle, text) end,
      queueEvent = function(...) self:queue(...) end,
      onHello = function(...) self:onHello(...) end,
      onReply = function(messageId) return self:onReply(messageId) end,
    }
  end
  M.onMessage(content, attempt.ctx)
end

function Session:onReply(messageId)
  if self.inFlight[messageId] then
    self.inFlight[messageId] = nil
    self.inFlightCount = self.inFlightCount - 1
  end
end

-- ready: a program asks to send a request (trapos_sandbox_send); anything else answers at once.
function Session:forward(messageId, msgType, payload)
  if type(messageId) ~= 'string' or messageId == '' then return end
  if type(msgType) ~= 'string' or msgType == '' then
    self:reply(messageId, errorValue('bad_request', 'type must be a non-empty string'))
    return
  end
  if self.state ~= 'ready' then
    local err = self.lastError
    if not (self.terminal and err) then
      err = errorValue('not_connected', 'not connected to the sandbox gateway' ..
        (err and (' (' .. tostring(err.message) .. ')') or ''))
    end
    self:reply(messageId, err)
    return
  end
  local okEncode, text = pcall(self.encode, M.computerRequest(self.traposId, messageId, msgType, M.coercePayload(payload)))
  if not okEncode or type(text) ~= 'string' or text == '' then
    self:reply(messageId, errorValue('bad_request', 'cannot encode: ' .. tostring(text)))
    return
  end
  if #text > M.MAX_FRAME then
    self:reply(messageId, errorValue('too_large', ('message of %d bytes'):format(#text)))
    return
  end
  local sent, err = self:sendOn(self.current.handle, text)
  if not sent then
    self:reply(messageId, errorValue('not_connected', 'send failed: ' .. tostring(err)))
    self:fail(errorValue('not_connected', 'send failed: ' .. tostring(err)))
    return
  end
  -- The map only makes a drop answer pending requests; past the cap, forget the oldest batch.
  if self.inFlightCount >= M.MAX_IN_FLIGHT then self.inFlight, self.inFlightCount = {}, 0 end
  self.inFlight[messageId] = true
  self.inFlightCount = self.inFlightCount + 1
end

-- stopped, by the owner.
function Session:stop()
  if self.stopped then return end
  self.stopped = true
  self:endAttempt('daemon stopped')
  self:clearReconnect()
  for i = 1, #self.disposers do self.disposers[i]() end
  self.disposers = {}
  self.state = 'stopped'
  self:publish()
end

-- Which OS event calls which method.
local SESSION_EVENTS = {
  websocket_success = 'onOpen',
  websocket_failure = 'onFailure',
  websocket_closed = 'onClosed',
  websocket_message = 'onFrame',
  [M.EVENT_SEND] = 'forward',
}

function Session:listen()
  for name, method in pairs(SESSION_EVENTS) do
    self.disposers[#self.disposers + 1] = self.loop.register(name, function(...)
      local ok, err = pcall(self[method], self, dropEventName(name, ...))
      if not ok then self.log(name .. ' handler failed: ' .. tostring(err)) end
    end)
  end
end

--[[ startSession(opts): the daemon. opts:
  url         gateway WebSocket URL (required), e.g. ws://host:4444/gateway
  secret      the shared password sent in hello (optional)
  http        table with websocketAsync(url, headers)     default _G.http
  eventLoop   register/setTimeout loop                     default _G.bootEventLoop or own loop
  encode, decode                                           default textutils JSON
  os          getComputerID/getComputerLabel/epoch/queueEvent  default _G.os
  random      function() -> [0,1)                          default math.random
  state       table to publish state into                  default _G.traposSandboxState
  log         function(message)                            default: none
  helloTimeout, connectTimeout, backoffMin, backoffMax, backoffJitter (seconds / fraction)
Returns a session: isReady(), lastError(), state(), status(), stop(), loop (the event loop used). ]]
function M.startSession(opts)
  expect(1, opts, 'table')
  local baseUrl = expectNonEmpty(1, opts.url)
  if opts.secret ~= nil and type(opts.secret) ~= 'string' then error('bad argument #1 (opts.secret: string expected)', 2) end
  local httpApi = opts.http or http
  if type(httpApi) ~= 'table' or type(httpApi.websocketAsync) ~= 'function' then
    error('bad argument #1 (opts.http with websocketAsync expected)', 2)
  end
  local osLike = opts.os or os
  local published = opts.state
  if published == nil then
    published = rawget(_G, 'traposSandboxState') or {}
    rawset(_G, 'traposSandboxState', published)
  end

  local self = setmetatable({
    baseUrl = baseUrl,
    secret = opts.secret,
    headers = opts.headers,
    http = httpApi,
    os = osLike,
    loop = opts.eventLoop or rawget(_G, 'bootEventLoop') or M.createEventLoop(osLike),
    encode = opts.encode or defaultEncode,
    decode = opts.decode or defaultDecode,
    random = opts.random or math.random,
    log = opts.log or function() end,
    helloTimeout = opts.helloTimeout or M.HELLO_TIMEOUT,
    connectTimeout = opts.connectTimeout or M.CONNECT_TIMEOUT,
    backoffMin = opts.backoffMin or M.BACKOFF_MIN,
    backoffMax = opts.backoffMax or M.BACKOFF_MAX,
    backoffJitter = opts.backoffJitter or M.BACKOFF_JITTER,
    published = published,
    traposId = M.traposId(osLike),
    state = 'connecting',
    terminal = false,
    stopped = false,
    attempts = 0,
    failures = 0,
    current = nil, -- the attempt: { url, handle, done, helloId, ctx, clearHello, clearConnect }
    closedHandles = setmetatable({}, { __mode = 'k' }),
    inFlight = {},
    inFlightCount = 0,
    disposers = {},
  }, Session)
  self:listen()

  local session = { loop = self.loop, traposId = self.traposId }
  function session.isReady() return self.state == 'ready' end
  function session.lastError() return self.lastError end
  function session.state() return self.state end
  function session.currentUrl() return self.current and self.current.url or nil end
  function session.status()
    return {
      state = self.state, connected = self.state == 'ready', running = not self.stopped,
      traposId = self.traposId, url = baseUrl, lastError = self.lastError, accountId = self.accountId,
      version = _VERSION, attempts = self.attempts,
    }
  end
  function session.stop() self:stop() end

  self:connect()
  return session
end

--[[ request(type, payload, opts) -> ok, payloadOrError
Queues trapos_sandbox_send and waits for the matching trapos_sandbox_reply or a timer.
opts: timeout (s, default 10), queueEvent, pullEvent, startTimer, cancelTimer, os. ]]
function M.request(msgType, payload, opts)
  expectNonEmpty(1, msgType)
  expect(2, payload, 'table', 'nil')
  expect(3, opts, 'table', 'nil')
  opts = opts or {}
  local osLike = opts.os or os
  local queueEvent = opts.queueEvent or osLike.queueEvent
  local pullEvent = opts.pullEvent or osLike.pullEvent
  local startTimer = opts.startTimer or osLike.startTimer
  local cancelTimer = opts.cancelTimer or osLike.cancelTimer
  local timeout = opts.timeout or M.REQUEST_TIMEOUT

  local messageId = M.newMessageId(osLike)
  local timer = startTimer(timeout)
  queueEvent(M.EVENT_SEND, messageId, msgType, M.coercePayload(payload))
  while true do
    local event, a, b, c, d = pullEvent()
    if event == M.EVENT_REPLY and a == messageId then
      if cancelTimer then pcall(cancelTimer, timer) end
      if b == true then return true, M.coercePayload(c) end
      return false, M.coerceError(d)
    elseif event == 'timer' and a == timer then
      return false, errorValue('timeout', ('no reply from the sandbox daemon within %s s'):format(tostring(timeout)))
    end
  end
end

return M
