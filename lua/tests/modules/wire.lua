local _VERSION = '0.1.0'

-- Unit tests for sandbox/wire.lua alone (with core and encoding): frames, hello, messageIds.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

local function fakeOs(label)
  return {
    getComputerID = function() return 12 end,
    getComputerLabel = function() return label end,
    epoch = function() return 1700000000123 end,
  }
end

test('traposId is id:label', function()
  local M = kit.modules('core', 'encoding', 'wire')
  eq(M.traposId(fakeOs('lab')), '12:lab', 'labelled')
  eq(M.traposId(fakeOs(nil)), '12:', 'no label')
  raises(function() M.traposId('x') end, 'bad argument #1', 'not an os')
end)

test('a computer request carries its sender and a coerced payload', function()
  local M = kit.modules('core', 'encoding', 'wire')
  local frame = M.computerRequest('12:', 'm-1', 'ping', { 1 })
  eq(frame.event, 'computer_request', 'event')
  eq(frame.traposSenderId, '12:', 'traposSenderId')
  eq(frame.messageId, 'm-1', 'messageId')
  eq(frame.type, 'ping', 'type')
  eq(frame.payload, {}, 'a list payload reads as {}')
  raises(function() M.computerRequest('', 'm', 't') end, 'non%-empty string expected', 'empty sender')
end)

test('messageIds are epoch-sequence and withNonce extends the query', function()
  local M = kit.modules('core', 'encoding', 'wire')
  local saved = rawget(_G, 'traposSandboxSeq')
  kit.onCleanup(function() rawset(_G, 'traposSandboxSeq', saved) end)
  rawset(_G, 'traposSandboxSeq', 41)
  eq(M.newMessageId(fakeOs()), '1700000000123-42', 'first')
  eq(M.newMessageId(fakeOs()), '1700000000123-43', 'next')
  eq(M.withNonce('ws://h/gateway', 5), 'ws://h/gateway?n=5', 'no query')
  eq(M.withNonce('ws://h/gateway?a=1', 5), 'ws://h/gateway?a=1&n=5', 'a query')
  truthy(#M.FEATURES > 0, 'the features hello announces')
end)

return kit.suite()
