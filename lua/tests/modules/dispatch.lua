local _VERSION = '0.1.0'

-- Unit tests for sandbox/dispatch.lua with a request table of its own (not the real handlers).
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

-- The modules dispatch needs, and a request table of two types: `echo` (no capability) and
-- `secret` (capability `fs.read`). Frames are Lua tables: decode looks the text up in `frames`,
-- encode keeps each sent frame in `sent`.
local function setUp(allowed)
  local M = kit.modules('core', 'encoding', 'wire', 'dispatch')
  M.REQUEST_CAPABILITY = { secret = 'fs.read' }
  local frames, sent = {}, {}
  local ctx = {
    traposId = '7:',
    handlers = {
      echo = function(req) req.respond(true, { said = req.payload.say }) end,
      secret = function(req) req.respond(true, { secret = 42 }) end,
      broken = function() error('handler bug') end,
    },
    decode = function(text) return frames[text] end,
    encode = function(frame) sent[#sent + 1] = frame; return 'frame ' .. #sent end,
    send = function() return true end,
    allowed = function(capability) return allowed[capability] == true end,
    queueEvent = function(...) sent[#sent + 1] = { queued = { ... } } end,
  }
  local function request(msgType, payload)
    frames.next = { event = 'gateway_request', messageId = 'g-1', type = msgType, payload = payload }
    return M.onMessage('next', ctx)
  end
  return M, ctx, frames, sent, request
end

test('a request goes to its handler and the answer to the gateway', function()
  local _, _, _, sent, request = setUp({})
  eq(request('echo', { say = 'hi' }), 'echo', 'dispatched')
  eq(sent[1].event, 'computer_response', 'answered')
  eq(sent[1].traposSenderId, '7:', 'by this computer')
  eq(sent[1].payload, { said = 'hi' }, 'with the handler\'s payload')
end)

test('a capability not allowed is forbidden and an unknown type unknown_type', function()
  local _, _, _, sent, request = setUp({})
  eq(request('secret'), 'forbidden', 'not allowed')
  eq(sent[1].error.code, 'forbidden', 'code')
  truthy(sent[1].error.message:find('sandbox allow fs.read', 1, true), sent[1].error.message)
  eq(request('nope'), 'unknown_type', 'unknown')
  eq(sent[2].error.code, 'unknown_type', 'code')
end)

test('an allowed capability reaches the handler; a handler that raises answers internal', function()
  local _, _, _, sent, request = setUp({ ['fs.read'] = true })
  eq(request('secret'), 'secret', 'allowed')
  eq(sent[1].payload, { secret = 42 }, 'answer')
  eq(request('broken'), 'broken', 'dispatched')
  eq(sent[2].error.code, 'internal', 'code')
  truthy(sent[2].error.message:find('handler bug', 1, true), sent[2].error.message)
end)

test('responses become replies for the program waiting; bad frames are ignored', function()
  local M, ctx, frames, sent = setUp({})
  frames.reply = { event = 'gateway_response', messageId = 'm-9', type = 'health', ok = true, payload = { up = true } }
  eq(M.onMessage('reply', ctx), 'reply', 'a reply')
  eq(sent[1].queued, { M.EVENT_REPLY, 'm-9', true, { up = true } }, 'queued for the program')
  frames.bad = { event = 'gateway_request', type = 'echo' }
  eq(M.onMessage('bad', ctx), 'ignored', 'no messageId')
  eq(M.onMessage('missing', ctx), 'ignored', 'does not decode')
  eq(M.onMessage('', ctx), 'ignored', 'empty')
end)

return kit.suite()
