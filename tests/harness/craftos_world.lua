--[[ Peripherals and a turtle for the CraftOS harness (SPEC §16), evaluated in a computer's
globals by tests.harness.craftos.install_world. Written from CC:Tweaked's documented API:

- `peripheral`: getNames, isPresent, getType (every type), hasType, getMethods, call, wrap,
  find. Like CraftOS-PC, `call` on an empty side returns nothing; an unknown method raises
  "No such method <name>".
- The peripherals are modelled on CraftOS-PC's emulated ones: monitor (write, setCursorPos,
  getCursorPos, getSize, clear, setTextScale, isColour; its lines readable by tests), printer
  (newPage, write, setPageTitle, endPage, getInkLevel, getPaperLevel, getPageSize), speaker
  (playNote, playSound), drive (isDiskPresent, getDiskLabel, setDiskLabel, getDiskID, hasData,
  getMountPath, ejectDisk), modem (open, isOpen, close, closeAll, transmit, isWireless).
- `turtle` (when asked for): a turtle at (0, 0, 0) facing north in a world of named blocks,
  16 inventory slots, fuel (1 per move, turns free, limit 20000; or "unlimited" when the
  server's need_fuel is off: setFuelNeeded(false)). Every action answers as CC:Tweaked
  does (true, or false and its reason; inspect's {name, state, tags}) after waiting for its
  own `turtle_response` event, as the real API does: it yields, so only a coroutine that is
  resumed with events (a job) can call it. Checked against CC:Tweaked's TurtleAPI.java and
  its commands: a move checks the way before the fuel ("Movement obstructed" wins over "Out
  of fuel"); refuel burns only the items that fit below the limit, refuel(0) only checks the
  item, a negative count raises "Refuel count N out of range"; slots outside 1..16 raise
  "Slot number N out of range", item counts outside 0..64 "Item count N out of range";
  dropping 0 items, or transferring from an empty slot, succeeds.

The returned table (also _G.harnessWorld) lets a test change the world: attach(name, type),
detach(name), insertDisk(name, id), touch(name, x, y), receive(name, channel, reply, message),
setRedstone(side, on), block(x, y, z, name), monitorLines(name), transmitted, pages; for the
turtle give(slot, name, count), blockAt(x, y, z), setFuelNeeded(needed), turtleState. ]]

local world = { peripherals = {}, order = {}, transmitted = {}, pages = {}, played = {} }
local unpack = table.unpack

local function queue(...) os.queueEvent(...) end

-- Peripheral models: each is make(name) -> { types = {...}, methods = { name = fn } }.
local MODELS = {}

function MODELS.monitor(name)
  local width, height, x, y = 15, 5, 1, 1
  local lines = {}
  local function blank() for row = 1, height do lines[row] = (' '):rep(width) end end
  blank()
  local m = { types = { 'monitor' }, lines = lines }
  m.methods = {
    write = function(text)
      text = tostring(text)
      if y >= 1 and y <= height then
        local line = lines[y]
        for i = 1, #text do
          local col = x + i - 1
          if col >= 1 and col <= width then line = line:sub(1, col - 1) .. text:sub(i, i) .. line:sub(col + 1) end
        end
        lines[y] = line
      end
      x = x + #text
    end,
    setCursorPos = function(newX, newY)
      if type(newX) ~= 'number' or type(newY) ~= 'number' then error('bad argument #1 (number expected)', 0) end
      x, y = math.floor(newX), math.floor(newY)
    end,
    getCursorPos = function() return x, y end,
    getSize = function() return width, height end,
    clear = function() blank() end,
    setTextScale = function(scale)
      if type(scale) ~= 'number' or scale < 0.5 or scale > 5 then error('Expected number in range 0.5-5', 0) end
    end,
    isColour = function() return true end,
  }
  m.methods.isColor = m.methods.isColour
  return m
end

function MODELS.printer(name)
  local page, ink, paper = nil, 64, 64
  local m = { types = { 'printer' } }
  m.methods = {
    newPage = function()
      if page or ink < 1 or paper < 1 then return false end
      ink, paper = ink - 1, paper - 1
      page = { title = '', text = {} }
      return true
    end,
    write = function(text)
      if not page then error('Page not started', 0) end
      page.text[#page.text + 1] = tostring(text)
    end,
    setPageTitle = function(title)
      if not page then error('Page not started', 0) end
      page.title = tostring(title or '')
    end,
    endPage = function()
      if not page then return false end
      world.pages[#world.pages + 1] = { title = page.title, text = table.concat(page.text) }
      page = nil
      return true
    end,
    getInkLevel = function() return ink end,
    getPaperLevel = function() return paper end,
    getPageSize = function() return 25, 21 end,
  }
  return m
end

local INSTRUMENTS = {
  harp = true, basedrum = true, snare = true, hat = true, bass = true, flute = true, bell = true,
  guitar = true, chime = true, xylophone = true, iron_xylophone = true, cow_bell = true,
  didgeridoo = true, bit = true, banjo = true, pling = true,
}

function MODELS.speaker(name)
  return { types = { 'speaker' }, methods = {
    playNote = function(instrument, volume, pitch)
      if not INSTRUMENTS[instrument] then error(('Invalid instrument, "%s"!'):format(tostring(instrument)), 0) end
      world.played[#world.played + 1] = { instrument = instrument, volume = volume or 1, pitch = pitch or 1 }
      return true
    end,
    playSound = function(sound)
      world.played[#world.played + 1] = { sound = sound }
      return true
    end,
  } }
end

function MODELS.drive(name)
  local m = { types = { 'drive' } }
  m.methods = {
    isDiskPresent = function() return m.disk ~= nil end,
    getDiskLabel = function() return m.disk and m.disk.label end,
    setDiskLabel = function(label)
      if not m.disk then error('No disk in drive', 0) end
      m.disk.label = label
    end,
    getDiskID = function() return m.disk and m.disk.id end,
    hasData = function() return m.disk ~= nil end,
    getMountPath = function() return m.disk and 'disk' or nil end,
    ejectDisk = function()
      if m.disk then m.disk = nil; queue('disk_eject', name) end
    end,
  }
  return m
end

function MODELS.modem(name)
  local open, count = {}, 0
  local function channel(value)
    if type(value) ~= 'number' or value < 0 or value > 65535 or value % 1 ~= 0 then
      error('Expected number in range 0-65535', 0)
    end
    return value
  end
  local m = { types = { 'modem' }, open = open }
  m.methods = {
    open = function(ch)
      ch = channel(ch)
      if not open[ch] then
        if count >= 128 then error('Too many open channels', 0) end
        open[ch], count = true, count + 1
      end
    end,
    isOpen = function(ch) return open[channel(ch)] == true end,
    close = function(ch)
      ch = channel(ch)
      if open[ch] then open[ch], count = nil, count - 1 end
    end,
    closeAll = function() for ch in pairs(open) do open[ch] = nil end; count = 0 end,
    transmit = function(ch, reply, message)
      channel(ch); channel(reply)
      world.transmitted[#world.transmitted + 1] = { channel = ch, replyChannel = reply, message = message }
    end,
    isWireless = function() return true end,
  }
  return m
end

-- The peripheral API ------------------------------------------------------------------

function world.attach(name, kind)
  local make = MODELS[kind]
  if not make then error('no model for ' .. tostring(kind), 2) end
  if not world.peripherals[name] then world.order[#world.order + 1] = name end
  world.peripherals[name] = make(name)
  queue('peripheral', name)
  return world.peripherals[name]
end

function world.detach(name)
  if not world.peripherals[name] then return end
  world.peripherals[name] = nil
  for i = #world.order, 1, -1 do
    if world.order[i] == name then table.remove(world.order, i) end
  end
  queue('peripheral_detach', name)
end

function world.insertDisk(name, id)
  local drive = world.peripherals[name]
  drive.disk = { id = id }
  queue('disk', name)
end

function world.touch(name, x, y) queue('monitor_touch', name, x, y) end

function world.receive(name, ch, reply, message)
  local modem = world.peripherals[name]
  if modem.open[ch] then queue('modem_message', name, ch, reply, message, 12) end
end

function world.monitorLines(name) return world.peripherals[name].lines end

local redstoneInputs = {}
function world.setRedstone(side, on)
  redstoneInputs[side] = on and true or false
  queue('redstone')
end

redstone = {
  getSides = function() return { 'bottom', 'top', 'back', 'front', 'right', 'left' } end,
  getInput = function(side) return redstoneInputs[side] == true end,
  getAnalogInput = function(side) return redstoneInputs[side] and 15 or 0 end,
  setOutput = function() end,
  getOutput = function() return false end,
}

local function methodNames(p)
  local names = {}
  for method in pairs(p.methods) do names[#names + 1] = method end
  table.sort(names)
  return names
end

peripheral = {}

function peripheral.getNames()
  local names = {}
  for i, name in ipairs(world.order) do names[i] = name end
  return names
end

function peripheral.isPresent(name) return world.peripherals[name] ~= nil end

function peripheral.getType(name)
  local p = world.peripherals[name]
  if p then return unpack(p.types) end
  return nil
end

function peripheral.hasType(name, kind)
  local p = world.peripherals[name]
  if not p then return nil end
  for _, each in ipairs(p.types) do
    if each == kind then return true end
  end
  return false
end

function peripheral.getMethods(name)
  local p = world.peripherals[name]
  return p and methodNames(p) or nil
end

function peripheral.call(name, method, ...)
  if type(name) ~= 'string' then error('bad argument #1 (string expected, got ' .. type(name) .. ')', 2) end
  if type(method) ~= 'string' then error('bad argument #2 (string expected, got ' .. type(method) .. ')', 2) end
  local p = world.peripherals[name]
  if not p then return nil end -- CraftOS-PC: nothing on an empty side
  local fn = p.methods[method]
  if not fn then error('No such method ' .. method, 2) end
  return fn(...)
end

function peripheral.wrap(name)
  local p = world.peripherals[name]
  if not p then return nil end
  local wrapped = {}
  for method in pairs(p.methods) do
    wrapped[method] = function(...) return peripheral.call(name, method, ...) end
  end
  return wrapped
end

function peripheral.find(kind)
  local found = {}
  for _, name in ipairs(world.order) do
    if peripheral.hasType(name, kind) then found[#found + 1] = peripheral.wrap(name) end
  end
  return unpack(found)
end

-- The turtle ------------------------------------------------------------------------------

local FUEL_VALUE = { ['minecraft:coal'] = 80, ['minecraft:charcoal'] = 80, ['minecraft:stick'] = 5 }
local HEADINGS = { { 0, -1 }, { 1, 0 }, { 0, 1 }, { -1, 0 } } -- north, east, south, west

function world.makeTurtle()
  local t = { x = 0, y = 0, z = 0, facing = 1, fuel = 0, fuelLimit = 20000, fuelNeeded = true,
    selected = 1, slots = {}, blocks = {} }
  world.turtleState = t
  function world.setFuelNeeded(needed) t.fuelNeeded = needed and true or false end
  local key = function(x, y, z) return x .. ',' .. y .. ',' .. z end
  function world.block(x, y, z, name) t.blocks[key(x, y, z)] = name and { name = name } or nil end
  function world.blockAt(x, y, z) local b = t.blocks[key(x, y, z)]; return b and b.name end
  function world.give(slot, name, count) t.slots[slot] = { name = name, count = count } end

  local function target(direction)
    if direction == 'up' then return t.x, t.y + 1, t.z end
    if direction == 'down' then return t.x, t.y - 1, t.z end
    local h = HEADINGS[t.facing]
    if direction == 'back' then return t.x - h[1], t.y, t.z - h[2] end
    return t.x + h[1], t.y, t.z + h[2]
  end

  -- Like CC:Tweaked's turtle API: the command's answer arrives as a turtle_response event.
  local nextCommand = 0
  local function respond(...)
    nextCommand = nextCommand + 1
    local id = nextCommand
    os.queueEvent('turtle_response', id, ...)
    while true do
      local event = table.pack(os.pullEvent('turtle_response'))
      if event[2] == id then return unpack(event, 3, event.n) end
    end
  end

  local function checkSlot(slot, index)
    if slot == nil then return t.selected end
    if type(slot) ~= 'number' then error(('bad argument #%d (number expected, got %s)'):format(index or 1, type(slot)), 3) end
    if slot % 1 ~= 0 then error(('bad argument #%d (number has no integer representation)'):format(index or 1), 3) end
    if slot < 1 or slot > 16 then error(('Slot number %d out of range'):format(slot), 3) end
    return slot
  end

  -- CC:Tweaked's checkCount: drop, suck and transferTo take 0..64 items, 64 by default.
  local function checkCount(count, index)
    if count == nil then return 64 end
    if type(count) ~= 'number' then error(('bad argument #%d (number expected, got %s)'):format(index or 1, type(count)), 3) end
    if count < 0 or count > 64 then error(('Item count %d out of range'):format(count), 3) end
    return count
  end

  -- Stores `count` of `name` from the selected slot on; -> whether it all fit.
  local function store(name, count)
    for i = 0, 15 do
      local slot = (t.selected - 1 + i) % 16 + 1
      local s = t.slots[slot]
      if not s then
        t.slots[slot] = { name = name, count = count }
        queue('turtle_inventory')
        return true
      elseif s.name == name and s.count + count <= 64 then
        s.count = s.count + count
        queue('turtle_inventory')
        return true
      end
    end
    return false
  end

  local function take(slot, count)
    local s = t.slots[slot]
    count = math.min(count, s.count)
    s.count = s.count - count
    if s.count == 0 then t.slots[slot] = nil end
    queue('turtle_inventory')
    return count
  end

  local function move(direction)
    return function()
      local x, y, z = target(direction)
      -- TurtleMoveCommand: the way first, then the fuel; a move costs 1 when fuel is needed.
      if t.blocks[key(x, y, z)] then return respond(false, 'Movement obstructed') end
      if t.fuelNeeded and t.fuel < 1 then return respond(false, 'Out of fuel') end
      t.x, t.y, t.z = x, y, z
      if t.fuelNeeded then t.fuel = t.fuel - 1 end
      return respond(true)
    end
  end

  local function dig(direction)
    return function()
      local x, y, z = target(direction)
      local b = t.blocks[key(x, y, z)]
      if not b then return respond(false, 'Nothing to dig here') end
      t.blocks[key(x, y, z)] = nil
      store(b.name, 1)
      return respond(true)
    end
  end

  local function place(direction)
    return function()
      local s = t.slots[t.selected]
      if not s then return respond(false, 'No items to place') end
      local x, y, z = target(direction)
      if t.blocks[key(x, y, z)] then return respond(false, 'Cannot place block here') end
      t.blocks[key(x, y, z)] = { name = s.name }
      take(t.selected, 1)
      return respond(true)
    end
  end

  local function detect(direction)
    return function()
      local x, y, z = target(direction)
      return respond(t.blocks[key(x, y, z)] ~= nil)
    end
  end

  local function inspect(direction)
    return function()
      local x, y, z = target(direction)
      local b = t.blocks[key(x, y, z)]
      if not b then return respond(false, 'No block to inspect') end
      return respond(true, { name = b.name, state = {}, tags = {} })
    end
  end

  local function compare(direction)
    return function()
      local x, y, z = target(direction)
      local b, s = t.blocks[key(x, y, z)], t.slots[t.selected]
      return respond((b and b.name) == (s and s.name))
    end
  end

  local function attack() return function() return respond(false, 'Nothing to attack here') end end

  local function drop()
    return function(count)
      count = checkCount(count)
      if count == 0 then return respond(true) end -- "Dropping nothing is easy"
      local s = t.slots[t.selected]
      if not s then return respond(false, 'No items to drop') end
      take(t.selected, count)
      return respond(true)
    end
  end

  local function suck()
    return function(count)
      checkCount(count)
      return respond(false, 'No items to take')
    end
  end

  local api = {
    forward = move('forward'), back = move('back'), up = move('up'), down = move('down'),
    turnLeft = function() t.facing = (t.facing + 2) % 4 + 1; return respond(true) end,
    turnRight = function() t.facing = t.facing % 4 + 1; return respond(true) end,
    dig = dig('forward'), digUp = dig('up'), digDown = dig('down'),
    place = place('forward'), placeUp = place('up'), placeDown = place('down'),
    detect = detect('forward'), detectUp = detect('up'), detectDown = detect('down'),
    inspect = inspect('forward'), inspectUp = inspect('up'), inspectDown = inspect('down'),
    compare = compare('forward'), compareUp = compare('up'), compareDown = compare('down'),
    attack = attack(), attackUp = attack(), attackDown = attack(),
    drop = drop(), dropUp = drop(), dropDown = drop(),
    suck = suck(), suckUp = suck(), suckDown = suck(),
    equipLeft = function() return respond(false, 'Not a valid upgrade') end,
    equipRight = function() return respond(false, 'Not a valid upgrade') end,
    -- no craft: CC:Tweaked has turtle.craft only on a crafty turtle (a crafting table equipped)
  }
  function api.select(slot)
    t.selected = checkSlot(slot)
    return true
  end
  function api.getSelectedSlot() return t.selected end
  function api.getItemCount(slot)
    local s = t.slots[checkSlot(slot)]
    return s and s.count or 0
  end
  function api.getItemSpace(slot)
    local s = t.slots[checkSlot(slot)]
    return s and 64 - s.count or 64
  end
  function api.getItemDetail(slot)
    local s = t.slots[checkSlot(slot)]
    return s and { name = s.name, count = s.count } or nil
  end
  function api.compareTo(slot)
    local a, b = t.slots[t.selected], t.slots[checkSlot(slot)]
    return (a and a.name) == (b and b.name)
  end
  function api.transferTo(slot, count)
    slot = checkSlot(slot)
    count = checkCount(count, 2)
    local from, to = t.slots[t.selected], t.slots[slot]
    -- TurtleTransferToCommand: nothing to move (an empty slot, a count of 0) succeeds.
    if not from or count == 0 then return respond(true) end
    if to and to.name ~= from.name then return respond(false, 'No space for items') end
    local space = to and 64 - to.count or 64
    local moved = math.min(count, from.count, space)
    if moved < 1 then return respond(false, 'No space for items') end
    take(t.selected, moved)
    if to then to.count = to.count + moved else t.slots[slot] = { name = from.name, count = moved } end
    return respond(true)
  end
  function api.getFuelLevel() return t.fuelNeeded and t.fuel or 'unlimited' end
  function api.getFuelLimit() return t.fuelNeeded and t.fuelLimit or 'unlimited' end
  -- TurtleRefuelCommand and FurnaceRefuelHandler: refuel(0) only checks the item; otherwise
  -- at most `count` items burn, and no more than fill the tank (the last one may overflow).
  function api.refuel(count)
    if count == nil then count = math.huge end
    if type(count) ~= 'number' then error(('bad argument #1 (number expected, got %s)'):format(type(count)), 2) end
    if count < 0 then error(('Refuel count %d out of range'):format(count), 2) end
    local s = t.slots[t.selected]
    if not s then return respond(false, 'No items to combust') end
    local value = FUEL_VALUE[s.name]
    if not value then return respond(false, 'Items not combustible') end
    local used = math.min(count, s.count, math.ceil((t.fuelLimit - t.fuel) / value))
    if used > 0 then
      take(t.selected, used)
      t.fuel = math.min(t.fuelLimit, t.fuel + used * value)
    end
    return respond(true)
  end
  turtle = api
  return api
end

harnessWorld = world
return world
