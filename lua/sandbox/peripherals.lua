local _VERSION = '0.1.0'

-- libsandbox's module sandbox/peripherals: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Peripherals and turtles =====================================================
-- Owns: list_peripherals, call_peripheral, peripheral_events and turtle (SPEC §16): a Lua
-- value as JSON, calls that may yield, the turtle's move budget.
-- Needs: constants, encodings, loop, jobs, handlers, console. Registers those four request
-- types.

local M, internal = ...
local badRequest = internal.badRequest
local dropEventName = internal.dropEventName
local errorText = internal.errorText
local errorValue = internal.errorValue
local isWhole = internal.isWhole
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local startJob = internal.startJob
local stringList = internal.stringList

--[[ A Lua value as JSON: strings, booleans and finite numbers as they are; tables as arrays
(keys exactly 1..n) or objects (other keys as text); nil inside a list as null; functions,
coroutines, userdata, NaN and infinities, cycles and tables nested deeper than M.JSON_DEPTH
as their type name ("function", "table"), so any peripheral's answer can be sent. ]]
local function jsonNull()
  local textutilsApi = rawget(_G, 'textutils')
  return textutilsApi and textutilsApi.json_null or nil
end

local function toJsonValue(value, seen, depth)
  local t = type(value)
  if t == 'string' or t == 'boolean' then return value end
  if t == 'number' then
    if value ~= value or value == math.huge or value == -math.huge then return tostring(value) end
    return value
  end
  if t == 'nil' then return jsonNull() end
  if t ~= 'table' or seen[value] or depth > M.JSON_DEPTH then return t end
  seen[value] = true
  local count, largest, isList = 0, 0, true
  for k in pairs(value) do
    count = count + 1
    if isWhole(k) and k >= 1 then
      if k > largest then largest = k end
    else
      isList = false
    end
  end
  local out = {}
  if isList and largest == count then
    for i = 1, count do out[i] = toJsonValue(value[i], seen, depth + 1) end
    out = jsonList(out)
  else
    for k, v in pairs(value) do out[tostring(k)] = toJsonValue(v, seen, depth + 1) end
  end
  seen[value] = nil
  return out
end

-- A packed list of Lua values (table.pack) as a JSON list, nils as null.
local function jsonValues(packed, first)
  local out = {}
  for i = first, packed.n do out[#out + 1] = toJsonValue(packed[i], {}, 1) end
  return jsonList(out)
end
M.toJsonValue = function(value) return toJsonValue(value, {}, 1) end

-- args of call_peripheral and turtle: a JSON list (may be absent); -> list, n | nil, message
local function argList(value)
  if value == nil then return {}, 0 end
  if type(value) ~= 'table' then return nil, 'args must be a list' end
  local n = 0
  for k in pairs(value) do
    if not isWhole(k) or k < 1 then return nil, 'args must be a list' end
    if k > n then n = k end
  end
  local list = {}
  for i = 1, n do
    if value[i] ~= jsonNull() then list[i] = value[i] end
  end
  return list, n
end

local function peripheralError(message)
  return errorValue('peripheral_error', message)
end

local function peripheralApi(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  if type(session.peripheral) ~= 'table' then
    req.respond(false, nil, peripheralError('this computer has no peripheral API'))
    return
  end
  return session, session.peripheral
end

-- list_peripherals {} -> {peripherals: [{name, types, methods}]}. getType returns every type
-- of a peripheral (CC:Tweaked 1.99+: "monitor", or "inventory" beside "minecraft:chest").
local function handleListPeripherals(req, ctx)
  local _, api = peripheralApi(req, ctx)
  if not api then return end
  local list = {}
  for _, name in ipairs(api.getNames()) do
    local types = table.pack(api.getType(name))
    local typeNames = {}
    for i = 1, types.n do
      if type(types[i]) == 'string' then typeNames[#typeNames + 1] = types[i] end
    end
    local methods = {}
    for _, method in ipairs(api.getMethods(name) or {}) do methods[#methods + 1] = tostring(method) end
    table.sort(methods)
    list[#list + 1] = { name = name, types = jsonList(typeNames), methods = jsonList(methods) }
  end
  req.respond(true, { peripherals = jsonList(list) })
end
-- list_peripherals: {peripherals: [{name, types, methods}]} (§16)
registerRequest('list_peripherals', 'peripheral', handleListPeripherals)

--[[ A call that may yield (CC:Tweaked's turtle actions and main-thread peripheral methods wait
for an event) runs as a job beside the daemon, like exec: it is resumed with the events it
waits for, times out after M.PERIPHERAL_TIMEOUT_MS, and `cancel` ends it. `body` returns
the call's values; `answer(job, packed)` makes the final answer (or nil, error). ]]
local function startCall(session, req, body, answer)
  startJob(session, req, {
    body = body, timeoutMs = M.PERIPHERAL_TIMEOUT_MS, maxOutputBytes = 1024,
    answer = function(job, result)
      if job.stopReason == 'timeout' then
        return nil, errorValue('timeout', ('no answer within %d ms'):format(M.PERIPHERAL_TIMEOUT_MS))
      end
      if not result[1] then return nil, peripheralError(errorText(result[2])) end
      return answer(result)
    end,
  })
end

-- call_peripheral {name, method, args?} -> {returns}; CraftOS's error is peripheral_error.
local function handleCallPeripheral(req, ctx)
  local session, api = peripheralApi(req, ctx)
  if not api then return end
  local payload = req.payload
  local name, method = payload.name, payload.method
  if type(name) ~= 'string' or name == '' then return badRequest(req, 'name must be a non-empty string') end
  if type(method) ~= 'string' or method == '' then return badRequest(req, 'method must be a non-empty string') end
  local args, n = argList(payload.args)
  if not args then return badRequest(req, n) end
  -- CraftOS-PC's peripheral.call on an empty side returns nil: say so instead.
  if not api.isPresent(name) then return req.respond(false, nil, peripheralError('no peripheral named ' .. name)) end
  startCall(session, req, function() return api.call(name, method, table.unpack(args, 1, n)) end,
    function(result) return { returns = jsonValues(result, 2) } end)
end
-- call_peripheral: {returns} as JSON; peripheral_error
registerRequest('call_peripheral', 'peripheral', handleCallPeripheral)

--[[ peripheral_events {events?, timeoutMs?}: each peripheral event (M.PERIPHERAL_EVENTS, or
the names given) as a partial {type: "event", name, args} until cancelled, the connection
ends, or timeoutMs (then the answer is {events: count, timedOut: true}). Counted with the
screen watches (at most M.MAX_WATCHES at once). ]]
M.PERIPHERAL_EVENTS = {
  'peripheral', 'peripheral_detach', 'monitor_touch', 'monitor_resize', 'redstone', 'modem_message',
  'disk', 'disk_eject', 'speaker_audio_empty', 'turtle_inventory',
}

local EventWatch = {}
EventWatch.__index = EventWatch

function EventWatch:stop(reason)
  if self.done then return false end
  self.done = true
  for i = 1, #self.disposers do self.disposers[i]() end
  if self.clearTimeout then self.clearTimeout() end
  local session = self.session
  session.watches[self.req.messageId] = nil
  session.watchCount = session.watchCount - 1
  if reason == 'timeout' then
    self.req.respond(true, { events = self.count, timedOut = true })
  elseif reason == 'cancel' then
    self.req.respond(false, nil, errorValue('cancelled', 'cancelled by the gateway'))
  elseif reason == 'stopped' then
    self.req.respond(false, nil, session:stopReason() or errorValue('stopped', 'stopped on the computer'))
  else
    self.req.respond(false, nil, errorValue('not_connected', 'the connection ended'))
  end
  return true
end

local function handlePeripheralEvents(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local names, err = stringList(req.payload.events, 'events')
  if not names then return badRequest(req, err) end
  if #names == 0 then names = M.PERIPHERAL_EVENTS end
  local timeoutMs
  timeoutMs, err = optionalNumber(req.payload, 'timeoutMs', M.EVENTS_TIMEOUT_MS, 1, M.EVENTS_MAX_TIMEOUT_MS)
  if not timeoutMs then return badRequest(req, err) end
  if session.watches[req.messageId] then return badRequest(req, 'a request with this messageId is running') end
  if session.watchCount >= M.MAX_WATCHES then
    return req.respond(false, nil, errorValue('overloaded', ('%d watches are running already'):format(session.watchCount)))
  end
  local watch = setmetatable({ session = session, req = req, attempt = session.current, count = 0, disposers = {} }, EventWatch)
  session.watches[req.messageId] = watch
  session.watchCount = session.watchCount + 1
  local seenName = {}
  for _, name in ipairs(names) do
    if not seenName[name] then
      seenName[name] = true
      watch.disposers[#watch.disposers + 1] = session.loop.register(name, function(...)
        if watch.done then return end
        watch.count = watch.count + 1
        req.partial({ type = 'event', name = name, args = jsonValues(table.pack(dropEventName(name, ...)), 1) })
      end)
    end
  end
  watch.clearTimeout = session.loop.setTimeout(function()
    watch.clearTimeout = nil
    watch:stop('timeout')
  end, timeoutMs / 1000)
end
-- peripheral_events: partials {type: "event", name, args}
registerRequest('peripheral_events', 'peripheral', handlePeripheralEvents)

-- turtle {action, args?} -> {returns, fuel, selected}. The actions of CC:Tweaked's turtle
-- API an agent may use (SPEC §16); the moves count against sandbox.turtle_budget while an
-- ask of this computer runs (Session:forward starts the count).
M.TURTLE_ACTIONS = {}
for _, action in ipairs({
  'turnLeft', 'turnRight', 'dig', 'digUp', 'digDown', 'place', 'placeUp', 'placeDown',
  'detect', 'detectUp', 'detectDown', 'inspect', 'inspectUp', 'inspectDown', 'compare',
  'compareUp', 'compareDown', 'compareTo', 'attack', 'attackUp', 'attackDown', 'drop', 'dropUp',
  'dropDown', 'suck', 'suckUp', 'suckDown', 'select', 'getSelectedSlot', 'getItemCount',
  'getItemSpace', 'getItemDetail', 'transferTo', 'getFuelLevel', 'getFuelLimit', 'refuel',
  'equipLeft', 'equipRight', 'craft',
}) do M.TURTLE_ACTIONS[action] = 'act' end
for _, action in ipairs({ 'forward', 'back', 'up', 'down' }) do M.TURTLE_ACTIONS[action] = 'move' end

M.NOT_A_TURTLE = 'this computer is not a turtle (no turtle API)'

local function turtleBudget(session)
  local value = session.settings and session.settings.get and session.settings.get('sandbox.turtle_budget')
  if type(value) ~= 'number' or value < 0 then return M.TURTLE_BUDGET end
  return math.floor(value)
end

local function handleTurtle(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local api = session.turtle
  if type(api) ~= 'table' then return req.respond(false, nil, errorValue('unknown_type', M.NOT_A_TURTLE)) end
  local action = req.payload.action
  local kind = type(action) == 'string' and M.TURTLE_ACTIONS[action]
  if not kind then return badRequest(req, ('unknown turtle action %s'):format(tostring(action))) end
  if type(api[action]) ~= 'function' then
    return req.respond(false, nil, peripheralError(('this turtle cannot %s (it needs an upgrade, e.g. a crafting table for craft)'):format(action)))
  end
  local args, n = argList(req.payload.args)
  if not args then return badRequest(req, n) end
  if kind == 'move' and session.asking then
    local budget = turtleBudget(session)
    if session.turtleMoves >= budget then
      return req.respond(false, nil, errorValue('forbidden', ('this ask has moved the turtle %d times, its budget '
        .. '(sandbox.turtle_budget); ask again, or raise it with "set sandbox.turtle_budget N"'):format(budget)))
    end
    session.turtleMoves = session.turtleMoves + 1
  end
  startCall(session, req, function() return api[action](table.unpack(args, 1, n)) end, function(result)
    local fuel = api.getFuelLevel and api.getFuelLevel()
    local selected = api.getSelectedSlot and api.getSelectedSlot()
    return { returns = jsonValues(result, 2), fuel = toJsonValue(fuel, {}, 1), selected = selected }
  end)
end
-- turtle: {returns, fuel, selected}; moves within the budget
registerRequest('turtle', 'turtle', handleTurtle)
