local _VERSION = '0.1.0'

-- libsandbox's module sandbox/wire: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Envelopes ===================================================================
-- Owns: the four wire frames (SPEC §2), hello, traposId, messageIds, the URL nonce.
-- Needs: constants, encodings. Exports: M.traposId, M.computerRequest, M.computerResponse,
-- M.gatewayRequest, M.gatewayResponse, M.hello, M.newMessageId, M.withNonce.

local M, internal = ...
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty
local jsonList = internal.jsonList

-- traposId = "<computerId>:<label>", label may be empty ("7:").
function M.traposId(osLike)
  osLike = osLike or os
  expect(1, osLike, 'table')
  local id = osLike.getComputerID()
  local label = osLike.getComputerLabel and osLike.getComputerLabel() or nil
  return ('%d:%s'):format(id, label or '')
end
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

-- What this client does beyond the first protocol, announced in hello (`features`) so the
-- gateway knows what it may send: a temporary file per write (part.writeId), move_file and
-- make_folder, and file parts as binary messages where the socket carries them (and several
-- whole files in one: write_files). A gateway older than this ignores the list.
M.FEATURES = { 'write_id', 'move_file', 'make_folder' }

-- Whether file parts cross as binary websocket messages (docs/protocol.md): CC:Tweaked's
-- websockets send and receive them byte for byte; CraftOS-PC keeps base64 parts in JSON.
function M.binaryParts()
  local host = rawget(_G, '_HOST')
  return not (type(host) == 'string' and host:find('CraftOS-PC', 1, true))
end

local function features()
  local list = { table.unpack(M.FEATURES) }
  if M.binaryParts() then
    list[#list + 1] = 'binary_parts'
    list[#list + 1] = 'write_files'
  end
  return list
end

-- capabilities: the allowed list (§9).
-- `stopped` (optional): the error value saying why the player stopped the agent here (SPEC
-- §16); hello then carries stopped = true and its message, so the gateway knows at once.
function M.hello(senderId, messageId, secret, version, capabilities, stopped)
  expectNonEmpty(1, senderId)
  expect(3, secret, 'string', 'nil')
  expect(5, capabilities, 'table', 'nil')
  expect(6, stopped, 'table', 'nil')
  local payload = {
    traposId = senderId,
    secret = secret or '',
    version = version or _VERSION,
    capabilities = jsonList(capabilities or {}),
    features = jsonList(features()),
  }
  if stopped then payload.stopped, payload.stopMessage = true, stopped.message end
  return M.computerRequest(senderId, messageId, 'hello', payload)
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
