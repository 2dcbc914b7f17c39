local _VERSION = '0.1.0'

-- libsandbox's module sandbox/dispatch: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Dispatch ====================================================================
-- Owns: turning one frame from the gateway into a handler call or a reply for a waiting
-- program (onMessage), the request object a handler answers through, the frame size limit.
-- Needs: constants, encodings, envelopes, the request table. Exports: M.onMessage.

local M, internal = ...
local defaultDecode = internal.defaultDecode
local defaultEncode = internal.defaultEncode
local errorValue = internal.errorValue
local expect = internal.expect

local function encodeFor(ctx)
  return ctx.encode or defaultEncode
end

local function encodeFrame(ctx, frame)
  local ok, text = pcall(encodeFor(ctx), frame)
  if not ok or type(text) ~= 'string' or text == '' then return nil end
  return text
end

-- Builds the request object handed to a handler; its answers go out through ctx.send.
-- `raw`: the bytes that came after the request's header in a binary message (a file part).
local function newRequest(ctx, messageId, msgType, payload, raw)
  local req = { messageId = messageId, type = msgType, payload = M.coercePayload(payload), answered = false,
    raw = raw }
  local function frameFor(ok, answer, err)
    return M.computerResponse(ctx.traposId, messageId, msgType, ok, answer, err)
  end

  function req.respond(ok, answer, err, shrink)
    if req.answered then return false end
    req.answered = true
    local text = encodeFrame(ctx, frameFor(ok, answer, err))
    while text and #text > M.MAX_SEND and shrink and shrink(answer) do
      text = encodeFrame(ctx, frameFor(ok, answer, err))
    end
    if text and #text > M.MAX_SEND then
      text = encodeFrame(ctx, frameFor(false, nil, errorValue('too_large',
        ('the answer is %d bytes, over the %d-byte frame limit'):format(#text, M.MAX_SEND))))
    end
    if not text then return false end
    return ctx.send(text) and true or false
  end

  -- A file part's answer as one binary message: the frame (answer without `data`), a newline,
  -- then `data` raw (docs/protocol.md, "Binary file parts"). Only where the socket sends
  -- binary messages (ctx.sendBinary).
  if ctx.sendBinary then
    function req.respondBinary(answer, data)
      if req.answered then return false end
      local text = encodeFrame(ctx, frameFor(true, answer))
      if not text or #text + 1 + #data > M.MAX_SEND then
        return req.respond(false, nil, errorValue('too_large', 'the part is over the frame limit'))
      end
      req.answered = true
      return ctx.sendBinary(text .. '\n' .. data) and true or false
    end
  end

  -- An interim answer (SPEC §2 streaming): ok, `partial: true`; the request stays open.
  function req.partial(answer)
    if req.answered then return false end
    local frame = frameFor(true, answer)
    frame.partial = true
    local text = encodeFrame(ctx, frame)
    if not text or #text > M.MAX_SEND then return false end
    return ctx.send(text) and true or false
  end
  return req
end

local function forbiddenMessage(ctx, capability)
  return ('computer %s has not allowed %s: on it, run "sandbox allow %s"'):format(
    tostring(ctx.traposId), capability, capability)
end

local function dispatchRequest(ctx, messageId, msgType, payload, raw)
  local handlers = ctx.handlers or M.requestHandlers
  local handler = handlers[msgType]
  local req = newRequest(ctx, messageId, msgType, payload, raw)
  if type(handler) ~= 'function' then
    req.respond(false, nil, errorValue('unknown_type', 'unknown request type: ' .. msgType))
    return 'unknown_type'
  end
  local capability = M.REQUEST_CAPABILITY[msgType]
  -- Stopped by the player (sandbox stop, or the stop side's redstone): only ping and cancel.
  local stopped = capability and ctx.stopped and ctx.stopped()
  if stopped then
    req.respond(false, nil, stopped)
    return 'stopped'
  end
  if capability and not (ctx.allowed and ctx.allowed(capability)) then
    req.respond(false, nil, errorValue('forbidden', forbiddenMessage(ctx, capability)))
    return 'forbidden'
  end
  local ok, err = pcall(handler, req, ctx)
  if not ok and not req.answered then
    req.respond(false, nil, errorValue('internal', tostring(err)))
  end
  return msgType
end

--[[ onMessage(content, ctx, raw?): handle one text frame from the gateway, or (`raw`) the
header of a binary one: a write_file part whose bytes are `raw`.
ctx = { traposId, send(text) -> ok, sendBinary(message)?, queueEvent(...), decode?, encode?,
        handlers?, onHello(messageId, ok, payload, error)?, onReply(messageId) -> consumed? }
Returns what it did: the request type it dispatched (e.g. 'ping'), 'unknown_type', 'forbidden',
'hello', 'reply' or 'ignored'. Never raises. ]]
function M.onMessage(content, ctx, raw)
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
    return dispatchRequest(ctx, messageId, msgType, frame.payload, raw)
  elseif raw then
    return 'ignored' -- the gateway sends only file parts' requests as binary messages

  elseif event == 'gateway_response' then
    local ok = frame.ok == true
    local payload, err
    if ok then payload = M.coercePayload(frame.payload) else err = M.coerceError(frame.error) end
    if msgType == 'hello' then
      if ctx.onHello then ctx.onHello(messageId, ok, payload, err) end
      return 'hello'
    end
    -- A partial answer to a program's streaming request: the request stays pending.
    if frame.partial == true then
      if ok then ctx.queueEvent(M.EVENT_PARTIAL, messageId, payload) end
      return 'partial'
    end
    -- An answer to the daemon's own request is consumed; others go to the program waiting.
    if ctx.onReply and ctx.onReply(messageId, ok, payload, err) == true then return 'reply' end
    ctx.queueEvent(M.EVENT_REPLY, messageId, ok, payload, err)
    return 'reply'
  end
  return 'ignored'
end

internal.encodeFrame = encodeFrame
