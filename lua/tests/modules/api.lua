local _VERSION = '0.1.0'

-- Unit tests for sandbox/api.lua alone (with core, encoding and wire): request and newWrapper.
local kit = ...
local test, eq, raises = kit.test, kit.eq, kit.raises

local function load()
  return kit.modules('core', 'encoding', 'wire', 'api')
end

test('request sends through the daemon and returns the matching reply', function()
  local M = load()
  local savedSeq = rawget(_G, 'traposSandboxSeq')
  kit.onCleanup(function() rawset(_G, 'traposSandboxSeq', savedSeq) end)
  local queued = {}
  local pulls = 0
  local ok, payload = M.request('health', nil, {
    os = { epoch = function() return 0 end },
    queueEvent = function(...) queued[#queued + 1] = { ... } end,
    pullEvent = function()
      pulls = pulls + 1
      if pulls == 1 then return M.EVENT_REPLY, 'another-request', true, {} end
      return M.EVENT_REPLY, queued[1][2], true, { sandboxOk = true }
    end,
    startTimer = function() return 1 end,
    cancelTimer = function() end,
  })
  eq(queued[1][1], M.EVENT_SEND, 'queued for the daemon')
  eq(queued[1][3], 'health', 'type')
  eq(ok, true, 'ok')
  eq(payload, { sandboxOk = true }, 'the matching reply')
  eq(pulls, 2, 'a reply to another request is passed over')
  raises(function() M.request('') end, 'bad argument #1', 'a type is needed')
end)

test('newWrapper word-wraps streamed text at the width', function()
  local M = load()
  local lines, current = {}, {}
  local w = M.newWrapper(10, function(s) current[#current + 1] = s end, function()
    lines[#lines + 1] = table.concat(current)
    current = {}
  end)
  w.text('hello wor')
  w.text('ld and more')
  w.flush()
  lines[#lines + 1] = table.concat(current)
  eq(lines, { 'hello', 'world and', 'more' }, 'wrapped between words')
end)

return kit.suite()
