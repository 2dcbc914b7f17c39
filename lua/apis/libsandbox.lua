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

--[[ onMessage(content, ctx): handle one text frame from the gateway.
ctx = { traposId, send(text) -> ok, queueEvent(...), decode?, encode?,
        onHello(messageId, ok, payload, error)?, onReply(messageId)? }
Returns what it did: 'ping', 'unknown_type', 'hello', 'reply' or 'ignored'. Never raises. ]]
function M.onMessage(content, ctx)
  expect(2, ctx, 'table')
  if type(content) ~= 'string' or content == '' then return 'ignored' end
  local decode = ctx.decode or defaultDecode
  local encode = ctx.encode or defaultEncode
  local okDecode, frame = pcall(decode, content)
  if not okDecode or type(frame) ~= 'table' then return 'ignored' end
  local event, messageId, msgType = frame.event, frame.messageId, frame.type
  if type(messageId) ~= 'string' or messageId == '' or type(msgType) ~= 'string' or msgType == '' then
    return 'ignored'
  end

  if event == 'gateway_request' then
    local response, result
    if msgType == 'ping' then
      response = M.computerResponse(ctx.traposId, messageId, 'ping', true, { traposId = ctx.traposId })
      result = 'ping'
    else
      response = M.computerResponse(ctx.traposId, messageId, msgType, false, nil,
        errorValue('unknown_type', 'unknown request type: ' .. msgType))
      result = 'unknown_type'
    end
    local okEncode, text = pcall(encode, response)
    if okEncode and type(text) == 'string' and text ~= '' then ctx.send(text) end
    return result

  elseif event == 'gateway_response' then
    local ok = frame.ok == true
    local payload, err
    if ok then payload = M.coercePayload(frame.payload) else err = M.coerceError(frame.error) end
    if msgType == 'hello' then
      if ctx.onHello then ctx.onHello(messageId, ok, payload, err) end
      return 'hello'
    end
    if ctx.onReply then ctx.onReply(messageId) end
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
Returns a session: isReady(), lastError(), status(), stop(), loop (the event loop used). ]]
function M.startSession(opts)
  expect(1, opts, 'table')
  local baseUrl = expectNonEmpty(1, opts.url)
  local secret = opts.secret
  if secret ~= nil and type(secret) ~= 'string' then error('bad argument #1 (opts.secret: string expected)', 2) end
  local httpApi = opts.http or http
  if type(httpApi) ~= 'table' or type(httpApi.websocketAsync) ~= 'function' then
    error('bad argument #1 (opts.http with websocketAsync expected)', 2)
  end
  local osLike = opts.os or os
  local loop = opts.eventLoop or rawget(_G, 'bootEventLoop') or M.createEventLoop(osLike)
  local encode = opts.encode or defaultEncode
  local decode = opts.decode or defaultDecode
  local random = opts.random or math.random
  local log = opts.log or function() end
  local helloTimeout = opts.helloTimeout or M.HELLO_TIMEOUT
  local connectTimeout = opts.connectTimeout or M.CONNECT_TIMEOUT
  local backoffMin = opts.backoffMin or M.BACKOFF_MIN
  local backoffMax = opts.backoffMax or M.BACKOFF_MAX
  local backoffJitter = opts.backoffJitter or M.BACKOFF_JITTER
  local published = opts.state
  if published == nil then
    published = rawget(_G, 'traposSandboxState') or {}
    rawset(_G, 'traposSandboxState', published)
  end

  local traposId = M.traposId(osLike)
  local state = 'connecting' -- connecting | handshaking | ready | waiting | stopped
  local terminal = false
  local lastError = nil
  local accountId = nil
  local attempts = 0
  local failures = 0
  local current = nil -- { url, handle, done, helloId, clearHello, clearConnect }
  local clearReconnect = nil
  local closedHandles = setmetatable({}, { __mode = 'k' })
  local inFlight, inFlightCount = {}, 0
  local disposers = {}
  local stopped = false
  local session = { loop = loop, traposId = traposId }

  local function publish()
    if not published then return end
    published.running = not stopped
    published.state = state
    published.connected = state == 'ready'
    published.traposId = traposId
    published.url = baseUrl
    published.lastError = lastError
    published.accountId = accountId
    published.version = _VERSION
    published.updated = osLike.epoch and osLike.epoch('utc') or nil
  end

  local function queue(...)
    local ok, err = pcall(osLike.queueEvent, ...)
    if not ok then log('queueEvent failed: ' .. tostring(err)) end
  end

  local function closeHandle(handle)
    if handle == nil or closedHandles[handle] then return end
    closedHandles[handle] = true
    local ok, err = pcall(handle.close)
    if not ok then log('close failed: ' .. tostring(err)) end
  end

  local function safeSend(handle, text)
    if handle == nil or closedHandles[handle] then return false, 'connection closed' end
    if type(text) ~= 'string' or text == '' then return false, 'refusing to send an empty message' end
    local ok, err = pcall(handle.send, text)
    if not ok then return false, tostring(err) end
    return true
  end

  local function failInFlight(message)
    local ids = inFlight
    inFlight, inFlightCount = {}, 0
    for id in pairs(ids) do
      queue(M.EVENT_REPLY, id, false, nil, errorValue('not_connected', message))
    end
  end

  -- Ends the current attempt: timers cleared, handle closed once, pending sends failed.
  local function endAttempt(message)
    local attempt = current
    if not attempt or attempt.done then return end
    attempt.done = true
    if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
    if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
    closeHandle(attempt.handle)
    failInFlight(message or 'connection lost')
  end

  local connect

  local function scheduleReconnect()
    if terminal or stopped then return end
    failures = failures + 1
    local base = backoffMin
    for _ = 2, failures do
      base = base * 2
      if base >= backoffMax then base = backoffMax; break end
    end
    if base > backoffMax then base = backoffMax end
    local delay = base * (1 - backoffJitter * random())
    state = 'waiting'
    publish()
    log(('reconnecting in %.1f s'):format(delay))
    if clearReconnect then clearReconnect() end
    clearReconnect = loop.setTimeout(function()
      clearReconnect = nil
      connect()
    end, delay)
  end

  local function stopForGood(err)
    terminal = true
    lastError = err
    endAttempt(err.code .. ': ' .. (err.message or ''))
    if clearReconnect then clearReconnect(); clearReconnect = nil end
    state = 'stopped'
    publish()
    log('stopped: ' .. err.code .. ' ' .. (err.message or ''))
  end

  local function isCurrent(url)
    return current ~= nil and not current.done and url == current.url
  end

  function connect()
    if terminal or stopped then return end
    attempts = attempts + 1
    local nonce = ('%.0f-%d-%d'):format(osLike.epoch and osLike.epoch('utc') or 0, attempts,
      math.floor(random() * 1000000))
    local attempt = { url = M.withNonce(baseUrl, nonce) }
    current = attempt
    state = 'connecting'
    publish()
    attempt.clearConnect = loop.setTimeout(function()
      attempt.clearConnect = nil
      if current == attempt and not attempt.done and state == 'connecting' then
        lastError = errorValue('not_connected', 'connection attempt timed out')
        endAttempt('connection attempt timed out')
        scheduleReconnect()
      end
    end, connectTimeout)
    local ok, result, err = pcall(httpApi.websocketAsync, attempt.url, opts.headers)
    if not ok or result == false then
      -- CC:Tweaked may also queue websocket_failure for this URL; the attempt is done by then.
      lastError = errorValue('not_connected', tostring(ok and (err or 'websocket refused') or result))
      endAttempt(lastError.message)
      scheduleReconnect()
    end
  end

  local function onHello(messageId, ok, payload, err)
    local attempt = current
    if state ~= 'handshaking' or not attempt or attempt.done or messageId ~= attempt.helloId then return end
    if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
    if ok then
      state = 'ready'
      failures = 0
      lastError = nil
      accountId = payload and payload.accountId or nil
      publish()
      log('connected as ' .. traposId)
      queue(M.EVENT_CONNECTED, traposId)
    elseif err and err.code == 'unauthorized' then
      stopForGood(err)
    else
      lastError = err
      endAttempt('hello failed')
      scheduleReconnect()
    end
  end

  local function onReply(messageId)
    if inFlight[messageId] then
      inFlight[messageId] = nil
      inFlightCount = inFlightCount - 1
    end
  end

  local handlers = {}

  function handlers.websocket_success(url, handle)
    if not isCurrent(url) or current.handle then
      -- A late success for an abandoned attempt: nobody will use it, free the slot.
      if type(handle) == 'table' and not (current and current.handle == handle) then closeHandle(handle) end
      return
    end
    local attempt = current
    attempt.handle = handle
    if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
    state = 'handshaking'
    publish()
    attempt.helloId = M.newMessageId(osLike)
    local okEncode, text = pcall(encode, M.hello(traposId, attempt.helloId, secret, _VERSION))
    local sent, sendErr = false, text
    if okEncode then sent, sendErr = safeSend(handle, text) end
    if not sent then
      lastError = errorValue('not_connected', 'could not send hello: ' .. tostring(sendErr))
      endAttempt(lastError.message)
      scheduleReconnect()
      return
    end
    attempt.clearHello = loop.setTimeout(function()
      attempt.clearHello = nil
      if current == attempt and not attempt.done and state == 'handshaking' then
        lastError = errorValue('timeout', ('no hello answer within %d s'):format(helloTimeout))
        endAttempt(lastError.message)
        scheduleReconnect()
      end
    end, helloTimeout)
  end

  function handlers.websocket_failure(url, err)
    if not isCurrent(url) then return end
    lastError = errorValue('not_connected', 'connection failed: ' .. tostring(err or 'unknown error'))
    endAttempt(lastError.message)
    scheduleReconnect()
  end

  function handlers.websocket_closed(url, reason, code)
    if not isCurrent(url) then return end
    local attempt = current
    -- The socket is gone: make sure we never call close() on it afterwards.
    if attempt.handle then closedHandles[attempt.handle] = true end
    local detail = (type(reason) == 'string' and reason ~= '') and reason or nil
    if code == M.CLOSE_REPLACED then
      stopForGood(errorValue('replaced', detail or 'replaced by a newer connection with the same traposId'))
      return
    end
    if code == M.CLOSE_UNAUTHORIZED then
      stopForGood(errorValue('unauthorized', detail or 'the gateway rejected the password'))
      return
    end
    local message = 'connection closed'
    if code then message = message .. ' (' .. tostring(code) .. (detail and (' ' .. detail) or '') .. ')' end
    lastError = errorValue('not_connected', message)
    endAttempt(message)
    scheduleReconnect()
  end

  function handlers.websocket_message(url, content, isBinary)
    if not isCurrent(url) or not current.handle or isBinary then return end
    local handle = current.handle
    M.onMessage(content, {
      traposId = traposId,
      encode = encode,
      decode = decode,
      send = function(text) return safeSend(handle, text) end,
      queueEvent = queue,
      onHello = onHello,
      onReply = onReply,
    })
  end

  handlers[M.EVENT_SEND] = function(messageId, msgType, payload)
    if type(messageId) ~= 'string' or messageId == '' then return end
    if type(msgType) ~= 'string' or msgType == '' then
      queue(M.EVENT_REPLY, messageId, false, nil, errorValue('bad_request', 'type must be a non-empty string'))
      return
    end
    if state ~= 'ready' then
      local err
      if terminal and lastError then
        err = lastError
      else
        err = errorValue('not_connected', 'not connected to the sandbox gateway' ..
          (lastError and (' (' .. tostring(lastError.message) .. ')') or ''))
      end
      queue(M.EVENT_REPLY, messageId, false, nil, err)
      return
    end
    local okEncode, text = pcall(encode, M.computerRequest(traposId, messageId, msgType, M.coercePayload(payload)))
    if not okEncode or type(text) ~= 'string' or text == '' then
      queue(M.EVENT_REPLY, messageId, false, nil, errorValue('bad_request', 'cannot encode: ' .. tostring(text)))
      return
    end
    if #text > M.MAX_FRAME then
      queue(M.EVENT_REPLY, messageId, false, nil, errorValue('too_large', ('message of %d bytes'):format(#text)))
      return
    end
    local sent, err = safeSend(current.handle, text)
    if not sent then
      queue(M.EVENT_REPLY, messageId, false, nil, errorValue('not_connected', 'send failed: ' .. tostring(err)))
      lastError = errorValue('not_connected', 'send failed: ' .. tostring(err))
      endAttempt('send failed')
      scheduleReconnect()
      return
    end
    if inFlightCount >= 256 then inFlight, inFlightCount = {}, 0 end
    inFlight[messageId] = true
    inFlightCount = inFlightCount + 1
  end

  local function guard(name, fn)
    return function(...)
      local ok, err = pcall(fn, dropEventName(name, ...))
      if not ok then log(name .. ' handler failed: ' .. tostring(err)) end
    end
  end

  for name, fn in pairs(handlers) do
    disposers[#disposers + 1] = loop.register(name, guard(name, fn))
  end

  function session.isReady() return state == 'ready' end
  function session.lastError() return lastError end
  function session.state() return state end
  function session.currentUrl() return current and current.url or nil end
  function session.status()
    return {
      state = state, connected = state == 'ready', running = not stopped, traposId = traposId,
      url = baseUrl, lastError = lastError, accountId = accountId, version = _VERSION,
      attempts = attempts,
    }
  end
  function session.stop()
    if stopped then return end
    stopped = true
    endAttempt('daemon stopped')
    if clearReconnect then clearReconnect(); clearReconnect = nil end
    for i = 1, #disposers do disposers[i]() end
    disposers = {}
    state = 'stopped'
    publish()
  end

  connect()
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
