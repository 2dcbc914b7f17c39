local _VERSION = '0.1.0'

-- Unit tests for sandbox/console.lua: the input request, checked whole, then queued in batches.
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

local function setUp()
  local M = kit.modules('core', 'encoding', 'capture', 'screen', 'handlers', 'console',
    'requests')
  local savedKeys = rawget(_G, 'keys')
  kit.onCleanup(function() rawset(_G, 'keys', savedKeys) end)
  rawset(_G, 'keys', { enter = 28, a = 30 })
  local timers = {}
  local session = { queued = {}, loop = { setTimeout = function(fn) timers[#timers + 1] = fn end } }
  function session:queue(...) self.queued[#self.queued + 1] = { ... } end
  -- call(payload) -> the answer so far (nil until answered), and a getter of the final one.
  local function call(payload)
    local answer
    local req = { payload = payload }
    function req.respond(ok, result, err) answer = { ok = ok, result = result, err = err } end
    M.requestHandlers.input(req, { session = session })
    return answer, function() return answer end
  end
  return M, session, timers, call
end

test('input queues the CraftOS events in order', function()
  local _, session, _, call = setUp()
  local answer = call({ events = {
    { char = 'a' }, { key = 'enter', held = true }, { keyUp = 'a' }, { paste = 'hi' },
    { mouseClick = { button = 1, x = 2, y = 3 } }, { terminate = true },
  } })
  eq(answer.ok, true, 'ok')
  eq(answer.result, { queued = 6 }, 'answer')
  eq(session.queued, {
    { 'char', 'a' }, { 'key', 28, true }, { 'key_up', 30 }, { 'paste', 'hi' },
    { 'mouse_click', 1, 2, 3 }, { 'terminate' },
  }, 'events')
end)

test('one bad event refuses them all, naming it', function()
  local _, session, _, call = setUp()
  local answer = call({ events = { { char = 'a' }, { key = 'nosuchkey' } } })
  eq(answer.ok, false, 'refused')
  eq(answer.err.code, 'bad_request', 'code')
  truthy(answer.err.message:find('events[1] unknown key name nosuchkey', 1, true), answer.err.message)
  eq(#session.queued, 0, 'nothing queued')
end)

test('a long input waits for the queue to drain between batches', function()
  local M, session, timers, call = setUp()
  local events = {}
  for i = 1, M.INPUT_BATCH + 1 do events[i] = { char = 'x' } end
  local first, final = call({ events = events })
  eq(first, nil, 'not answered yet')
  eq(#session.queued, M.INPUT_BATCH, 'one batch')
  eq(#timers, 1, 'then a timer')
  timers[1]() -- the batch has left the queue: the rest goes, and the request is answered
  eq(#session.queued, M.INPUT_BATCH + 1, 'the rest')
  eq(final().result, { queued = M.INPUT_BATCH + 1 }, 'answered')
end)

return kit.suite()
