local _VERSION = '0.1.0'

-- libsandbox's module sandbox/console: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Screen and input ===========================================================
-- Owns: screen, screen_watch (the screen, then its changes as partials) and input (keys, chars,
-- paste, mouse, terminate) (SPEC §14). Needs: constants, the screen, handlers.
-- Exports: M.NO_SCREEN; isWhole. Registers screen, screen_watch and input.

local M, internal = ...
local badRequest = internal.badRequest
local errorValue = internal.errorValue
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local startWatch = internal.startWatch

--[[ The screen is the daemon's recorder of the native terminal (sandbox/screen, installed when the
daemon starts, however it was started). A session without one (no term.native, or started
with `recorder = false`) falls back to a readable terminal (one with getLine, i.e. a window)
recorded in _G.traposSandboxScreen, as older installers' startup files did. ]]
M.NO_SCREEN = 'this computer has no readable screen: the sandbox daemon could not record its terminal '
  .. '(no term.native)'

local function readableScreen(session)
  if session.recorder then
    session.recorder.sync()
    return session.recorder
  end
  local screen = session.screen()
  if type(screen) == 'table' and type(screen.getLine) == 'function' and type(screen.getSize) == 'function' then
    return screen
  end
end

local function handleScreen(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local screen = readableScreen(session)
  if not screen then return req.respond(false, nil, errorValue('internal', M.NO_SCREEN)) end
  local width, height = screen.getSize()
  local cursorX, cursorY = 1, 1
  if screen.getCursorPos then cursorX, cursorY = screen.getCursorPos() end
  local lines, text, background = {}, {}, {}
  for y = 1, height do
    local line, fg, bg = screen.getLine(y)
    lines[y] = line or ''
    text[y] = fg
    background[y] = bg
  end
  local answer = { width = width, height = height, cursorX = cursorX, cursorY = cursorY, lines = lines }
  if #text == height then answer.text = text end
  if #background == height then answer.background = background end
  req.respond(true, answer)
end
-- screen: the whole screen's lines and colours
registerRequest('screen', 'screen', handleScreen)

-- screen_watch {maxFps?}: partials until cancelled or the connection ends (see Watch).
local function handleScreenWatch(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local maxFps, err = optionalNumber(req.payload, 'maxFps', M.SCREEN_WATCH_FPS, 1, 20)
  if not maxFps then return badRequest(req, err) end
  if not session.recorder then return req.respond(false, nil, errorValue('internal', M.NO_SCREEN)) end
  startWatch(session, req, session.recorder, maxFps)
end
-- screen_watch: the screen, then its changes as partials (§14)
registerRequest('screen_watch', 'screen', handleScreenWatch)

-- Input (SPEC §14) ----------------------------------------------------------------------

M.MAX_INPUT_EVENTS = 256 -- events in one input request (bad_request past that)
M.INPUT_BATCH = 32       -- events queued before the daemon waits for the queue to drain

local function keyCode(name)
  local keysApi = rawget(_G, 'keys')
  local code = type(name) == 'string' and type(keysApi) == 'table' and keysApi[name] or nil
  if type(code) == 'number' then return code end
end

local function isWhole(value) return type(value) == 'number' and value == math.floor(value) end

-- {button | direction, x, y} as the mouse event `name`'s parameters.
local function mouseEvent(name, first, allowed)
  return function(value)
    if type(value) ~= 'table' or not (isWhole(value.x) and isWhole(value.y)) then
      return nil, ('needs {%s, x, y} with whole numbers'):format(first)
    end
    if not allowed[value[first]] then return nil, ('%s must be one of %s'):format(first, allowed.text) end
    return { name, value[first], value.x, value.y }
  end
end

-- Each input kind: its JSON key -> a check that returns the CraftOS event, or nil, message.
local INPUT_KINDS = {
  char = function(value)
    if type(value) == 'string' and #value == 1 then return { 'char', value } end
    return nil, 'char must be one character'
  end,
  key = function(value, event)
    local code = keyCode(value)
    if not code then return nil, 'unknown key name ' .. tostring(value) end
    if event.held ~= nil and type(event.held) ~= 'boolean' then return nil, 'held must be true or false' end
    return { 'key', code, event.held == true }
  end,
  keyUp = function(value)
    local code = keyCode(value)
    if not code then return nil, 'unknown key name ' .. tostring(value) end
    return { 'key_up', code }
  end,
  paste = function(value)
    if type(value) == 'string' then return { 'paste', value } end
    return nil, 'paste must be a string'
  end,
  terminate = function(value)
    if value == true then return { 'terminate' } end
    return nil, 'terminate must be true'
  end,
  mouseClick = mouseEvent('mouse_click', 'button', { true, true, true, text = '1, 2, 3' }),
  mouseUp = mouseEvent('mouse_up', 'button', { true, true, true, text = '1, 2, 3' }),
  mouseScroll = mouseEvent('mouse_scroll', 'direction', { [-1] = true, [1] = true, text = '-1, 1' }),
}

-- One input event -> the CraftOS event to queue, or nil, message.
local function inputEvent(event)
  if type(event) ~= 'table' then return nil, 'must be an object' end
  local kind
  for key in pairs(event) do
    if INPUT_KINDS[key] then
      if kind then return nil, 'has both ' .. kind .. ' and ' .. key end
      kind = key
    elseif not (key == 'held' and event.key ~= nil) then
      return nil, 'unknown field ' .. tostring(key)
    end
  end
  if not kind then return nil, 'needs one of char, key, keyUp, paste, terminate, mouseClick, mouseUp, mouseScroll' end
  return INPUT_KINDS[kind](event[kind], event)
end

--[[ input {events}: every event is checked before any is queued (a bad one is bad_request
naming it, counted from 0 as in the JSON list). They are queued in order, M.INPUT_BATCH at a
time: after each batch the daemon arms a 0 s timer and queues the next batch when it fires. The
timer's event is queued behind the batch, so by then every event of the batch has left the
computer's queue (it drops events past 256); at most M.INPUT_BATCH + 1 of ours are in it at
once. The daemon's own loop is not a handler that may block (os.sleep would eat the events other
handlers wait for), hence the timer. Answer {queued}. ]]
local function handleInput(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local events = req.payload.events
  if events == nil then events = {} end
  if type(events) ~= 'table' then return badRequest(req, 'events must be a list') end
  for k in pairs(events) do
    if not isWhole(k) or k < 1 or k > #events then return badRequest(req, 'events must be a list') end
  end
  if #events > M.MAX_INPUT_EVENTS then
    return badRequest(req, ('%d events, at most %d in one request'):format(#events, M.MAX_INPUT_EVENTS))
  end
  local queue = {}
  for i = 1, #events do
    local event, err = inputEvent(events[i])
    if not event then return badRequest(req, ('events[%d] %s'):format(i - 1, err)) end
    queue[i] = event
  end
  local attempt, nextEvent = session.current, 1
  local function batch()
    if session.current ~= attempt or (attempt and attempt.done) then return end -- connection gone
    local last = math.min(nextEvent + M.INPUT_BATCH - 1, #queue)
    for i = nextEvent, last do session:queue(table.unpack(queue[i])) end
    nextEvent = last + 1
    if nextEvent > #queue then return req.respond(true, { queued = #queue }) end
    session.loop.setTimeout(batch, 0)
  end
  batch()
end
-- input: {events}: keys, chars, paste, mouse, terminate (§14)
registerRequest('input', 'input', handleInput)

internal.isWhole = isWhole
