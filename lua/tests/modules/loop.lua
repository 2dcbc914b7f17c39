local _VERSION = '0.1.0'

-- Unit tests for sandbox/loop.lua alone: the built-in event loop and listening to every event.
local kit = ...
local test, eq = kit.test, kit.eq

local function fakeOs(events)
  local o = { timers = 0, cancelled = {} }
  function o.startTimer() o.timers = o.timers + 1; return o.timers end
  function o.cancelTimer(id) o.cancelled[#o.cancelled + 1] = id end
  function o.pullEventRaw() return table.unpack(table.remove(events, 1)) end
  return o
end

test('handlers get the event\'s parameters, registerAny its name too', function()
  local M = kit.modules('core', 'loop')
  local loop = M.createEventLoop(fakeOs({}))
  local seen = {}
  local dispose = loop.register('char', function(c) seen[#seen + 1] = 'char ' .. c end)
  loop.registerAny(function(name, a) seen[#seen + 1] = 'any ' .. name .. ' ' .. tostring(a) end)
  loop.dispatch('char', 'x')
  dispose()
  loop.dispatch('char', 'y')
  eq(seen, { 'char x', 'any char x', 'any char y' }, 'calls')
end)

test('timers fire once and a cleared one never', function()
  local M = kit.modules('core', 'loop')
  local o = fakeOs({})
  local loop = M.createEventLoop(o)
  local fired = {}
  loop.setTimeout(function() fired[#fired + 1] = 'a' end, 1)
  local clear = loop.setTimeout(function() fired[#fired + 1] = 'b' end, 1)
  clear()
  loop.dispatch('timer', 1)
  loop.dispatch('timer', 1)
  loop.dispatch('timer', 2)
  eq(fired, { 'a' }, 'fired')
  eq(o.cancelled, { 2 }, 'the cleared timer is cancelled')
end)

test('run hands terminate to the handlers and stops only when told', function()
  local M = kit.modules('core', 'loop')
  local loop
  local seen = {}
  loop = M.createEventLoop(fakeOs({ { 'terminate' }, { 'key', 28 }, { 'stop' } }))
  loop.register('terminate', function() seen[#seen + 1] = 'terminate' end)
  loop.register('key', function(k) seen[#seen + 1] = k end)
  loop.register('stop', function() loop.stop() end)
  loop.run()
  eq(seen, { 'terminate', 28 }, 'both handled')
end)

test('listenAll falls back to PROGRAM_EVENTS on a loop without registerAny', function()
  local M, internal = kit.modules('core', 'loop')
  local registered = {}
  local loop = {
    register = function(name, fn)
      registered[name] = fn
      return function() registered[name] = nil end
    end,
  }
  local seen = {}
  local dispose = internal.listenAll(loop, function(...) seen[#seen + 1] = { ... } end)
  registered.key(28, false)
  registered.char('char', 'a') -- a loop that passes the name first
  eq(seen, { { 'key', 28, false }, { 'char', 'a' } }, 'name first, once')
  dispose()
  eq(next(registered), nil, 'every handler removed')
end)

return kit.suite()
