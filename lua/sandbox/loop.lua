local _VERSION = '0.1.0'

-- libsandbox's module sandbox/loop: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Event loop ==================================================================
-- Owns: the built-in event loop for plain CraftOS (trapos's bootEventLoop interface) and
-- listening to every event (what a program started by exec or eval waits on).
-- Needs: constants. Exports: M.createEventLoop, M.PROGRAM_EVENTS.

local M, internal = ...
local expect = internal.expect

-- Adds `handler` to `list`; returns the function that removes it again.
local function addHandler(list, handler)
  local entry = { fn = handler }
  list[#list + 1] = entry
  return function()
    for i = #list, 1, -1 do
      if list[i] == entry then table.remove(list, i) end
    end
  end
end

-- Built-in event loop for plain CraftOS: the same interface as trapos's bootEventLoop.
function M.createEventLoop(osLike)
  osLike = osLike or os
  local handlers = {}
  local anyHandlers = {}
  local timers = {}
  local running = false
  local loop = {}

  function loop.register(event, handler)
    expect(1, event, 'string')
    expect(2, handler, 'function')
    local list = handlers[event]
    if not list then list = {}; handlers[event] = list end
    return addHandler(list, handler)
  end

  -- Every event, with its name first (what a program run by exec or eval waits on).
  function loop.registerAny(handler)
    expect(1, handler, 'function')
    return addHandler(anyHandlers, handler)
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
    if #anyHandlers > 0 then
      local snapshot = {}
      for i = 1, #anyHandlers do snapshot[i] = anyHandlers[i] end
      for i = 1, #snapshot do snapshot[i].fn(event, ...) end
    end
  end

  -- Raw events: `terminate` is handed to the handlers (a program run by exec gets it) and never
  -- ends the loop. Every coroutine receives every terminate (SPEC §6): one typed into the
  -- computer by the gateway's `input`, or Ctrl+T meant for the shell the daemon runs beside,
  -- must not stop the daemon. It stops with the computer, or with stop().
  function loop.run()
    running = true
    local pull = osLike.pullEventRaw or osLike.pullEvent
    while running do
      loop.dispatch(pull())
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

-- Event names for loops without registerAny (trapos's bootEventLoop): what programs wait on.
M.PROGRAM_EVENTS = {
  'alarm', 'char', 'computer_command', 'disk', 'disk_eject', 'file_transfer', 'http_check',
  'http_failure', 'http_success', 'key', 'key_up', 'modem_message', 'monitor_resize',
  'monitor_touch', 'mouse_click', 'mouse_drag', 'mouse_scroll', 'mouse_up', 'paste', 'peripheral',
  'peripheral_detach', 'rednet_message', 'redstone', 'speaker_audio_empty', 'task_complete',
  'term_resize', 'terminate', 'timer', 'turtle_inventory', 'websocket_closed', 'websocket_failure',
  'websocket_message', 'websocket_success', M.EVENT_REPLY, M.EVENT_CONNECTED,
}

local function listenAll(loop, handler)
  if type(loop.registerAny) == 'function' then
    return loop.registerAny(function(...) return handler(...) end)
  end
  local disposers = {}
  for _, name in ipairs(M.PROGRAM_EVENTS) do
    disposers[#disposers + 1] = loop.register(name, function(...) handler(name, dropEventName(name, ...)) end)
  end
  return function()
    for i = 1, #disposers do disposers[i]() end
  end
end

internal.dropEventName = dropEventName
internal.listenAll = listenAll
