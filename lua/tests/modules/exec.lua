local _VERSION = '0.1.0'

-- Unit tests for sandbox/exec.lua and sandbox/jobs.lua: eval and cancel run as jobs beside a
-- fake daemon (its event loop is sandbox/loop.lua's, its timers fired by hand).
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

local MODULES = { 'core', 'encoding', 'loop', 'capture', 'screen', 'jobs', 'handlers', 'exec',
  'requests' }

local function setUp()
  local M = kit.modules(table.unpack(MODULES))
  local timers, nextTimer = {}, 0
  local osLike = {
    startTimer = function() nextTimer = nextTimer + 1; return nextTimer end,
    cancelTimer = function(id) timers[id] = nil end,
  }
  local session = {
    jobs = {}, jobCount = 0, watches = {}, loop = M.createEventLoop(osLike),
    clock = function() return 0 end,
    textutils = { serialize = function(v) return type(v) == 'string' and ('%q'):format(v) or tostring(v) end },
  }
  function session:stopReason() return nil end
  local answers = {}
  local function call(msgType, messageId, payload)
    local req = { messageId = messageId, type = msgType, payload = M.coercePayload(payload) }
    function req.respond(ok, result, err) answers[messageId] = { ok = ok, result = result, err = err } end
    function req.partial() return true end
    M.requestHandlers[msgType](req, { session = session })
  end
  return M, session, answers, call
end

test('eval answers an expression and its output', function()
  local _, session, answers, call = setUp()
  call('eval', 'e-1', { code = '6 * 7' })
  eq(answers['e-1'].ok, true, 'answered')
  eq(answers['e-1'].result.returns, { '42' }, 'returns, serialized')
  call('eval', 'e-2', { code = 'write("hi") printError("oops") return "x"' })
  eq(answers['e-2'].result.stdout, 'hioops\n', 'write and printError captured, in one stream')
  eq(answers['e-2'].result.returns, { '"x"' }, 'statements')
  eq(session.jobCount, 0, 'no job left running')
end)

test('an eval waiting for an event runs when it comes; cancel ends another', function()
  local _, session, answers, call = setUp()
  call('eval', 'e-1', { code = 'local _, c = coroutine.yield("char") return c' })
  eq(answers['e-1'], nil, 'waiting')
  eq(session.jobCount, 1, 'one job')
  session.loop.dispatch('key', 30)
  eq(answers['e-1'], nil, 'not the event it waits for')
  session.loop.dispatch('char', 'q')
  eq(answers['e-1'].result.returns, { '"q"' }, 'the event it waited for')
  -- Terminated as CraftOS's os.pullEvent would be.
  call('eval', 'e-2', { code = 'if coroutine.yield("never") == "terminate" then error("Terminated", 0) end' })
  eq(answers['e-2'], nil, 'running')
  call('cancel', 'c-1', { messageId = 'e-2' })
  eq(answers['e-2'].err.code, 'cancelled', 'cancelled')
  eq(answers['c-1'].ok, true, 'cancel answered')
  eq(session.jobCount, 0, 'no job left running')
end)

test('code that does not compile is an answer, not a failure', function()
  local _, _, answers, call = setUp()
  call('eval', 'e-1', { code = 'this is not lua' })
  eq(answers['e-1'].ok, true, 'ok')
  eq(answers['e-1'].result.ok, false, 'but the code failed')
  truthy(answers['e-1'].result.error:find('eval:1:', 1, true), answers['e-1'].result.error)
end)

return kit.suite()
