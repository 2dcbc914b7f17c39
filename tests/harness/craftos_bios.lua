-- The CraftOS emulation used by tests/harness/craftos.py. Runs inside a lupa Lua 5.2 runtime whose
-- strings are bytes on both sides. `host` holds the Python callbacks (I/O, timers, sockets, the
-- disk); everything CraftOS programs see (os, fs, term, window, colours, keys, settings,
-- textutils, http, parallel, shell, multishell) is built here. Returns the kernel table Python
-- drives.
--
-- Behaviour follows CC:Tweaked (its ROM: bios.lua, rom/apis/{term,window,colors,textutils,
-- parallel}.lua, rom/programs/shell.lua and advanced/multishell.lua; its Java: TermMethods,
-- Terminal, FSAPI, FileSystem, WritableFileMount, the file handles; Cobalt's timeout). This is
-- an independent implementation written for the harness from those sources' documented and
-- observed behaviour, not a copy of them.
local host, computerOptions = ...

local kernel = {}
local nativeLoad, nativePcall, nativeXpcall = load, pcall, xpcall
local tableUnpack, tablePack = table.unpack, table.pack
local nativeSethook = debug.sethook
local coCreate, coResume, coStatus, coRunning = coroutine.create, coroutine.resume, coroutine.status, coroutine.running
local clock = host.clock
local floor, rep = math.floor, string.rep

-- Remove what CraftOS does not have, or what would reach the host machine.
io, require, package, loadstring, unpack, setfenv, getfenv, module = nil, nil, nil, nil, nil, nil, nil, nil
collectgarbage, dofile, loadfile, python = nil, nil, nil, nil
string.dump = nil

local function typeNames(...)
  local n = select('#', ...)
  if n == 1 then return (...) end
  local names = { ... }
  return table.concat(names, ', ', 1, n - 1) .. ' or ' .. names[n]
end

-- cc.expect's check, for functions CraftOS writes in Lua: it names the function when it can.
local function expect(index, value, ...)
  local t = type(value)
  for i = 1, select('#', ...) do
    if t == select(i, ...) then return value end
  end
  local ok, info = nativePcall(debug.getinfo, 3, 'nS')
  if ok and info and info.name and info.name ~= '' and info.what ~= 'C' then
    error(("bad argument #%d to '%s' (%s expected, got %s)"):format(index, info.name, typeNames(...), t), 3)
  end
  error(('bad argument #%d (%s expected, got %s)'):format(index, typeNames(...), t), 3)
end

-- The same check for functions CC:Tweaked implements in Java (LuaValues.badArgument).
local function arg(index, value, ...)
  local t = type(value)
  for i = 1, select('#', ...) do
    if t == select(i, ...) then return value end
  end
  error(('bad argument #%d (%s expected, got %s)'):format(index, typeNames(...), t), 3)
end

-- IArguments.getInt: a number, truncated. `level` as error's (3: the API function's caller).
local function argInt(index, value, level)
  level = level or 3
  if type(value) ~= 'number' then
    error(('bad argument #%d (number expected, got %s)'):format(index, type(value)), level)
  end
  if value ~= value or value == math.huge or value == -math.huge then
    error(('bad argument #%d (number expected, got %s)'):format(index, tostring(value)), level)
  end
  if value >= 0 then return floor(value) end
  return -floor(-value)
end

-- IArguments.getStringCoerced: what term.write and a file handle's write make of a value.
local function coerceString(value)
  local t = type(value)
  if t == 'string' then return value end
  if t == 'number' and value == floor(value) and value >= -2147483648 and value <= 2147483647 then
    return ('%d'):format(value)
  end
  return tostring(value)
end

-- Too long without yielding ------------------------------------------------------
--
-- CC:Tweaked times how long the computer runs for each event; after 7 s Cobalt raises
-- "Too long without yielding" once, in whatever coroutine is running; 1.5 s after that it
-- kills the computer. Here a count hook on every coroutine checks the same clock (wall time
-- since the kernel began delivering the current event); coroutine.create/wrap install it on
-- coroutines programs make. A hard abort cannot be caught: pcall, xpcall and coroutine.resume
-- pass it on, and the kernel shuts the computer down.

local YIELD_LIMIT = computerOptions.yieldLimit or 7
local ABORT_GRACE = 1.5
local ABORT_MESSAGE = 'Too long without yielding'
local HOOK_COUNT = 5000
local sliceDeadline, softAborted, hardAborted = nil, false, false
local userHooks = setmetatable({}, { __mode = 'k' })

local function overdue()
  local deadline = sliceDeadline
  if not deadline then return false end
  local now = clock()
  if now < deadline then return false end
  if not softAborted then
    softAborted = true
    return true
  end
  if now >= deadline + ABORT_GRACE then hardAborted = true end
  return hardAborted
end

local function timeoutHook()
  if overdue() then error(ABORT_MESSAGE, 2) end
end

local function installHook(co)
  local user = userHooks[co]
  if not user then
    nativeSethook(co, timeoutHook, '', HOOK_COUNT)
    return
  end
  local fn, mask, count = user[1], user[2], user[3]
  nativeSethook(co, function(event, line)
    if event == 'count' then
      if overdue() then error(ABORT_MESSAGE, 2) end
      if count > 0 then fn(event) end
    else
      fn(event, line)
    end
  end, mask, count > 0 and math.min(count, HOOK_COUNT) or HOOK_COUNT)
end

local function passResult(ok, ...)
  if not ok and hardAborted then error((...), 0) end
  return ok, ...
end

function pcall(fn, ...) return passResult(nativePcall(fn, ...)) end
function xpcall(fn, handler, ...) return passResult(nativeXpcall(fn, handler, ...)) end

do
  local co = {}
  for k, v in pairs(coroutine) do co[k] = v end
  function co.create(fn)
    arg(1, fn, 'function')
    local thread = coCreate(fn)
    installHook(thread)
    return thread
  end
  function co.resume(thread, ...) return passResult(coResume(thread, ...)) end
  local function unwrap(ok, ...)
    if ok then return ... end
    error((...), 0)
  end
  function co.wrap(fn)
    arg(1, fn, 'function')
    local thread = co.create(fn)
    return function(...) return unwrap(coResume(thread, ...)) end
  end
  coroutine = co

  -- debug is CraftOS's whole debug library, but a program's hooks run beside the timeout's.
  local dbg = {}
  for k, v in pairs(debug) do dbg[k] = v end
  function dbg.sethook(...)
    local args = tablePack(...)
    local thread, i = coRunning(), 1
    if type(args[1]) == 'thread' then thread, i = args[1], 2 end
    if args[i] == nil then
      userHooks[thread] = nil
    else
      arg(i, args[i], 'function')
      arg(i + 1, args[i + 1], 'string')
      userHooks[thread] = { args[i], args[i + 1], args[i + 2] or 0 }
    end
    installHook(thread)
  end
  function dbg.gethook(thread)
    local user = userHooks[thread or coRunning()]
    if user then return user[1], user[2], user[3] end
  end
  debug = dbg
end

-- colours and keys -------------------------------------------------------------

colors = {
  white = 0x1, orange = 0x2, magenta = 0x4, lightBlue = 0x8, yellow = 0x10, lime = 0x20,
  pink = 0x40, gray = 0x80, lightGray = 0x100, cyan = 0x200, purple = 0x400, blue = 0x800,
  brown = 0x1000, green = 0x2000, red = 0x4000, black = 0x8000,
}
local HEX = '0123456789abcdef'
local blitOf = {}
for i = 0, 15 do blitOf[2 ^ i] = HEX:sub(i + 1, i + 1) end

function colors.combine(...)
  local r = 0
  for i = 1, select('#', ...) do r = bit32.bor(r, expect(i, (select(i, ...)), 'number')) end
  return r
end
function colors.subtract(set, ...)
  local r = expect(1, set, 'number')
  for i = 1, select('#', ...) do r = bit32.band(r, bit32.bnot(expect(i + 1, (select(i, ...)), 'number'))) end
  return r
end
function colors.test(set, colour)
  expect(1, set, 'number')
  expect(2, colour, 'number')
  return bit32.band(set, colour) == colour
end
function colors.packRGB(r, g, b)
  expect(1, r, 'number')
  expect(2, g, 'number')
  expect(3, b, 'number')
  return bit32.band(r * 255, 0xFF) * 65536 + bit32.band(g * 255, 0xFF) * 256 + bit32.band(b * 255, 0xFF)
end
function colors.unpackRGB(rgb)
  expect(1, rgb, 'number')
  return bit32.band(bit32.rshift(rgb, 16), 0xFF) / 255, bit32.band(bit32.rshift(rgb, 8), 0xFF) / 255,
    bit32.band(rgb, 0xFF) / 255
end
function colors.rgb8(r, g, b)
  if g == nil and b == nil then return colors.unpackRGB(r) end
  return colors.packRGB(r, g, b)
end
function colors.toBlit(colour)
  expect(1, colour, 'number')
  local hex = blitOf[colour]
  if hex then return hex end
  if colour < 0 or colour > 0xffff then error('Colour out of range', 2) end
  return ('%x'):format(floor(math.log(colour) / math.log(2)))
end
function colors.fromBlit(hex)
  expect(1, hex, 'string')
  if #hex ~= 1 then return nil end
  local value = tonumber(hex, 16)
  if not value then return nil end
  return 2 ^ value
end
colours = {}
for k, v in pairs(colors) do colours[k] = v end
colours.grey, colours.gray = colors.gray, nil
colours.lightGrey, colours.lightGray = colors.lightGray, nil

-- keys: GLFW key codes, as CC:Tweaked has them.
keys = {}
do
  local names = {
    [32] = 'space', [39] = 'apostrophe', [44] = 'comma', [45] = 'minus', [46] = 'period',
    [47] = 'slash', [48] = 'zero', [49] = 'one', [50] = 'two', [51] = 'three', [52] = 'four',
    [53] = 'five', [54] = 'six', [55] = 'seven', [56] = 'eight', [57] = 'nine',
    [59] = 'semicolon', [61] = 'equals', [91] = 'leftBracket', [92] = 'backslash',
    [93] = 'rightBracket', [96] = 'grave', [257] = 'enter', [258] = 'tab', [259] = 'backspace',
    [260] = 'insert', [261] = 'delete', [262] = 'right', [263] = 'left', [264] = 'down',
    [265] = 'up', [266] = 'pageUp', [267] = 'pageDown', [268] = 'home', [269] = 'end',
    [280] = 'capsLock', [281] = 'scrollLock', [282] = 'numLock', [283] = 'printScreen',
    [284] = 'pause', [320] = 'numPad0', [321] = 'numPad1', [322] = 'numPad2', [323] = 'numPad3',
    [324] = 'numPad4', [325] = 'numPad5', [326] = 'numPad6', [327] = 'numPad7',
    [328] = 'numPad8', [329] = 'numPad9', [330] = 'numPadDecimal', [331] = 'numPadDivide',
    [332] = 'numPadMultiply', [333] = 'numPadSubtract', [334] = 'numPadAdd',
    [335] = 'numPadEnter', [336] = 'numPadEqual', [340] = 'leftShift', [341] = 'leftCtrl',
    [342] = 'leftAlt', [343] = 'leftSuper', [344] = 'rightShift', [345] = 'rightCtrl',
    [346] = 'rightAlt', [348] = 'menu',
  }
  for i = 0, 25 do names[65 + i] = string.char(97 + i) end
  for i = 1, 25 do names[289 + i] = 'f' .. i end
  for code, name in pairs(names) do keys[name] = code end
  keys.scollLock = keys.scrollLock -- sic, as CC:Tweaked keeps it
  keys['return'] = keys.enter
  function keys.getName(code)
    expect(1, code, 'number')
    return names[code]
  end
end

-- The terminal -------------------------------------------------------------------

-- CC:Tweaked's default palette, by colour bit (white first).
local DEFAULT_PALETTE = {
  0xF0F0F0, 0xF2B233, 0xE57FD8, 0x99B2F2, 0xDEDE6C, 0x7FCC19, 0xF2B2CC, 0x4C4C4C,
  0x999999, 0x4C99B2, 0xB266E5, 0x3366CC, 0x7F664C, 0x57A64E, 0xCC4C4C, 0x111111,
}
local function splitRGB(rgb)
  return floor(rgb / 65536) % 256 / 255, floor(rgb / 256) % 256 / 255, rgb % 256 / 255
end

-- TermMethods.parseColour: the highest set bit of a colour, 0 to 15.
local function colourBit(index, colour)
  colour = argInt(index, colour, 4)
  if colour <= 0 then error('Colour out of range', 3) end
  local bit = -1
  while colour >= 1 do
    colour = floor(colour / 2)
    bit = bit + 1
  end
  if bit > 15 then error('Colour out of range', 3) end
  return bit
end

-- Write `s` into `line` (a row `width` cells wide) from column `x`, clipped to the row.
local function splice(line, x, s, width)
  local first, last = x, x + #s - 1
  if first < 1 then first = 1 end
  if last > width then last = width end
  if first > last then return line end
  return line:sub(1, first - 1) .. s:sub(first - x + 1, last - x + 1) .. line:sub(last + 1)
end

-- The computer's own terminal (Terminal + TermMethods): a text and colour buffer.
local function newNativeTerminal(width, height, isColour)
  local x, y, blink = 1, 1, false
  local fg, bg = 0, 15
  local text, fgs, bgs = {}, {}, {}
  local palette = {}
  local blank = rep(' ', width)
  local function fill(row)
    text[row], fgs[row], bgs[row] = blank, rep(HEX:sub(fg + 1, fg + 1), width), rep(HEX:sub(bg + 1, bg + 1), width)
  end
  for row = 1, height do fill(row) end
  for i = 0, 15 do palette[i] = { splitRGB(DEFAULT_PALETTE[i + 1]) } end

  local t = {}
  local function put(s, f, b)
    if y >= 1 and y <= height then
      text[y] = splice(text[y], x, s, width)
      fgs[y] = splice(fgs[y], x, f, width)
      bgs[y] = splice(bgs[y], x, b, width)
    end
    x = x + #s
  end
  function t.write(s)
    s = coerceString(s)
    put(s, rep(HEX:sub(fg + 1, fg + 1), #s), rep(HEX:sub(bg + 1, bg + 1), #s))
  end
  function t.blit(s, f, b)
    arg(1, s, 'string')
    arg(2, f, 'string')
    arg(3, b, 'string')
    if #f ~= #s or #b ~= #s then error('Arguments must be the same length', 2) end
    put(s, f, b)
  end
  function t.scroll(n)
    n = argInt(1, n)
    if n == 0 then return end
    local newText, newFg, newBg = {}, {}, {}
    local fgLine, bgLine = rep(HEX:sub(fg + 1, fg + 1), width), rep(HEX:sub(bg + 1, bg + 1), width)
    for row = 1, height do
      local from = row + n
      if from >= 1 and from <= height then
        newText[row], newFg[row], newBg[row] = text[from], fgs[from], bgs[from]
      else
        newText[row], newFg[row], newBg[row] = blank, fgLine, bgLine
      end
    end
    text, fgs, bgs = newText, newFg, newBg
  end
  function t.getCursorPos() return x, y end
  function t.setCursorPos(nx, ny)
    nx, ny = argInt(1, nx), argInt(2, ny)
    x, y = nx, ny
  end
  function t.getCursorBlink() return blink end
  function t.setCursorBlink(on) blink = arg(1, on, 'boolean') end
  function t.getSize() return width, height end
  function t.clear()
    for row = 1, height do fill(row) end
  end
  function t.clearLine()
    if y >= 1 and y <= height then fill(y) end
  end
  function t.getTextColour() return 2 ^ fg end
  function t.setTextColour(colour) fg = colourBit(1, colour) end
  function t.getBackgroundColour() return 2 ^ bg end
  function t.setBackgroundColour(colour) bg = colourBit(1, colour) end
  function t.isColour() return isColour end
  function t.setPaletteColour(colour, r, g, b)
    local bit = colourBit(1, colour)
    if g == nil and b == nil then
      r, g, b = splitRGB(argInt(2, r) % 0x1000000)
    else
      arg(2, r, 'number')
      arg(3, g, 'number')
      arg(4, b, 'number')
    end
    palette[bit] = { r, g, b }
  end
  function t.getPaletteColour(colour)
    local c = palette[colourBit(1, colour)]
    return c[1], c[2], c[3]
  end
  t.getTextColor, t.setTextColor = t.getTextColour, t.setTextColour
  t.getBackgroundColor, t.setBackgroundColor = t.getBackgroundColour, t.setBackgroundColour
  t.isColor = t.isColour
  t.setPaletteColor, t.getPaletteColor = t.setPaletteColour, t.getPaletteColour

  local function nativePaletteColour(colour)
    return splitRGB(DEFAULT_PALETTE[colourBit(1, colour) + 1])
  end
  local function snapshot()
    local rows = { text = {}, fg = {}, bg = {} }
    for row = 1, height do rows.text[row], rows.fg[row], rows.bg[row] = text[row], fgs[row], bgs[row] end
    rows.width, rows.height, rows.x, rows.y, rows.blink = width, height, x, y, blink
    return rows
  end
  return t, nativePaletteColour, snapshot
end

local native, nativePaletteColour, nativeSnapshot = newNativeTerminal(
  computerOptions.width or 51, computerOptions.height or 19, computerOptions.colour ~= false)
local redirectTarget = native

-- The flat log Python keeps (Computer.output): what print, write, printError, term.write and
-- term.blit were given, whatever terminal it went to.
local function log(text) host.out(text) end

term = {}
for k, v in pairs(native) do
  if type(v) == 'function' then
    term[k] = function(...) return redirectTarget[k](...) end
  end
end
function term.write(text)
  log(coerceString(text))
  return redirectTarget.write(text)
end
function term.blit(text, fg, bg)
  log(coerceString(text))
  return redirectTarget.blit(text, fg, bg)
end
term.nativePaletteColour, term.nativePaletteColor = nativePaletteColour, nativePaletteColour
local GRAPHICS_METHODS = {
  'setGraphicsMode', 'getGraphicsMode', 'setPixel', 'getPixel', 'drawPixels', 'getPixels',
  'showMouse', 'relativeMouse', 'setFrozen', 'getFrozen',
}
function term.redirect(target)
  expect(1, target, 'table')
  if target == term or target == _G.term then
    error('term is not a recommended redirect target, try term.current() instead', 2)
  end
  -- As CraftOS-PC's rom/apis/term.lua: its graphics-mode methods are lent from the native
  -- terminal when the target lacks them; every other native method the target does not have
  -- (looked up by indexing, so a metatable's __index counts) becomes a stub that raises
  -- "Redirect object is missing method X." when called, as CC:Tweaked's and CraftOS-PC's do.
  for _, method in ipairs(GRAPHICS_METHODS) do
    if target[method] == nil then target[method] = native[method] end
  end
  for k, v in pairs(native) do
    if type(k) == 'string' and type(v) == 'function' and type(target[k]) ~= 'function' then
      target[k] = function() error('Redirect object is missing method ' .. k .. '.', 2) end
    end
  end
  local previous = redirectTarget
  redirectTarget = target
  return previous
end
function term.current() return redirectTarget end
function term.native() return native end

-- window: a terminal drawn into a part of its parent, keeping what was drawn in it.
window = {}
function window.create(parent, nX, nY, width, height, startVisible)
  expect(1, parent, 'table')
  expect(2, nX, 'number')
  expect(3, nY, 'number')
  expect(4, width, 'number')
  expect(5, height, 'number')
  expect(6, startVisible, 'boolean', 'nil')
  if parent == term then
    error('term is not a recommended window parent, try term.current() instead', 2)
  end

  local visible = startVisible ~= false
  local cx, cy, blink = 1, 1, false
  local fg, bg = colors.white, colors.black
  local lines, palette = {}, {}

  local function blankLine()
    return { rep(' ', width), rep(blitOf[fg], width), rep(blitOf[bg], width) }
  end
  for row = 1, height do lines[row] = blankLine() end
  for i = 0, 15 do palette[2 ^ i] = { parent.getPaletteColour(2 ^ i) } end

  -- window.lua's parse_color: any number in range, rounded down to a power of two.
  local function toColour(colour)
    if blitOf[colour] then return colour end
    if type(colour) ~= 'number' then expect(1, colour, 'number') end
    if colour <= 0 or colour > 0xffff then error('Colour out of range', 3) end
    return 2 ^ floor(math.log(colour) / math.log(2) + 1e-9)
  end

  local function drawRow(row)
    local line = lines[row]
    parent.setCursorPos(nX, nY + row - 1)
    parent.blit(line[1], line[2], line[3])
  end
  local function drawAll()
    for row = 1, height do drawRow(row) end
  end
  local function placeCursor()
    if cx >= 1 and cy >= 1 and cx <= width and cy <= height then
      parent.setCursorPos(nX + cx - 1, nY + cy - 1)
    else
      parent.setCursorPos(0, 0)
    end
  end
  local function showCursor()
    parent.setTextColor(fg)
    placeCursor()
  end

  local function put(s, f, b)
    local first, last = cx, cx + #s - 1
    if cy >= 1 and cy <= height and first <= width and last >= 1 then
      local line = lines[cy]
      line[1] = splice(line[1], first, s, width)
      line[2] = splice(line[2], first, f, width)
      line[3] = splice(line[3], first, b, width)
      if visible then drawRow(cy) end
    end
    cx = last + 1
    if visible then showCursor() end
  end

  local w = {}
  function w.write(s)
    s = tostring(s)
    put(s, rep(blitOf[fg], #s), rep(blitOf[bg], #s))
  end
  function w.blit(s, f, b)
    if type(s) ~= 'string' then expect(1, s, 'string') end
    if type(f) ~= 'string' then expect(2, f, 'string') end
    if type(b) ~= 'string' then expect(3, b, 'string') end
    if #f ~= #s or #b ~= #s then error('Arguments must be the same length', 2) end
    put(s, f:lower(), b:lower())
  end
  function w.clear()
    for row = 1, height do lines[row] = blankLine() end
    if visible then
      drawAll()
      showCursor()
    end
  end
  function w.clearLine()
    if cy >= 1 and cy <= height then
      lines[cy] = blankLine()
      if visible then
        drawRow(cy)
        showCursor()
      end
    end
  end
  function w.getCursorPos() return cx, cy end
  function w.setCursorPos(x, y)
    if type(x) ~= 'number' then expect(1, x, 'number') end
    if type(y) ~= 'number' then expect(2, y, 'number') end
    cx, cy = floor(x), floor(y)
    if visible then placeCursor() end
  end
  function w.setCursorBlink(on)
    if type(on) ~= 'boolean' then expect(1, on, 'boolean') end
    blink = on
    if visible then parent.setCursorBlink(blink) end
  end
  function w.getCursorBlink() return blink end
  function w.isColour() return parent.isColour() end
  w.isColor = w.isColour
  function w.setTextColour(colour)
    fg = toColour(colour)
    if visible then parent.setTextColor(fg) end
  end
  w.setTextColor = w.setTextColour
  function w.setBackgroundColour(colour) bg = toColour(colour) end
  w.setBackgroundColor = w.setBackgroundColour
  function w.getTextColour() return fg end
  w.getTextColor = w.getTextColour
  function w.getBackgroundColour() return bg end
  w.getBackgroundColor = w.getBackgroundColour
  function w.setPaletteColour(colour, r, g, b)
    colour = toColour(colour)
    local entry
    if type(r) == 'number' and g == nil and b == nil then
      entry = { colours.unpackRGB(r) }
      palette[colour] = entry
    else
      if type(r) ~= 'number' then expect(2, r, 'number') end
      if type(g) ~= 'number' then expect(3, g, 'number') end
      if type(b) ~= 'number' then expect(4, b, 'number') end
      entry = palette[colour]
      entry[1], entry[2], entry[3] = r, g, b
    end
    if visible then return parent.setPaletteColour(colour, entry[1], entry[2], entry[3]) end
  end
  w.setPaletteColor = w.setPaletteColour
  function w.getPaletteColour(colour)
    local entry = palette[toColour(colour)]
    return entry[1], entry[2], entry[3]
  end
  w.getPaletteColor = w.getPaletteColour
  function w.getSize() return width, height end
  function w.scroll(n)
    if type(n) ~= 'number' then expect(1, n, 'number') end
    if n == 0 then return end
    local moved = {}
    for row = 1, height do
      local from = row + n
      moved[row] = (from >= 1 and from <= height) and lines[from] or blankLine()
    end
    lines = moved
    if visible then
      drawAll()
      showCursor()
    end
  end
  function w.getLine(row)
    if type(row) ~= 'number' then expect(1, row, 'number') end
    if row < 1 or row > height then error('Line is out of range.', 2) end
    local line = lines[row]
    return line[1], line[2], line[3]
  end
  function w.setVisible(on)
    if type(on) ~= 'boolean' then expect(1, on, 'boolean') end
    if visible ~= on then
      visible = on
      if visible then w.redraw() end
    end
  end
  function w.isVisible() return visible end
  function w.redraw()
    if not visible then return end
    drawAll()
    for colour, entry in pairs(palette) do parent.setPaletteColour(colour, entry[1], entry[2], entry[3]) end
    parent.setCursorBlink(blink)
    showCursor()
  end
  function w.restoreCursor()
    if not visible then return end
    parent.setCursorBlink(blink)
    showCursor()
  end
  function w.getPosition() return nX, nY end
  function w.reposition(newX, newY, newWidth, newHeight, newParent)
    if type(newX) ~= 'number' then expect(1, newX, 'number') end
    if type(newY) ~= 'number' then expect(2, newY, 'number') end
    if newWidth ~= nil or newHeight ~= nil then
      expect(3, newWidth, 'number')
      expect(4, newHeight, 'number')
    end
    if newParent ~= nil and type(newParent) ~= 'table' then expect(5, newParent, 'table') end
    nX, nY = newX, newY
    if newParent then parent = newParent end
    if newWidth and newHeight then
      local oldWidth = width
      width = newWidth
      local resized = {}
      for row = 1, newHeight do
        local line = lines[row]
        if not line then
          resized[row] = blankLine()
        elseif newWidth == oldWidth then
          resized[row] = line
        elseif newWidth < oldWidth then
          resized[row] = { line[1]:sub(1, newWidth), line[2]:sub(1, newWidth), line[3]:sub(1, newWidth) }
        else
          local pad = newWidth - oldWidth
          resized[row] = { line[1] .. rep(' ', pad), line[2] .. rep(blitOf[fg], pad), line[3] .. rep(blitOf[bg], pad) }
        end
      end
      height, lines = newHeight, resized
    end
    if visible then w.redraw() end
  end

  if visible then w.redraw() end
  return w
end

-- write, print, printError ------------------------------------------------------

-- bios.lua's write: whitespace is written as it is, a word that does not fit moves to the next
-- line, a word wider than the terminal is broken; the terminal scrolls at the bottom.
local function draw(text)
  local t = redirectTarget
  local width, height = t.getSize()
  local x, y = t.getCursorPos()
  local lines = 0
  local function newLine()
    if y + 1 <= height then
      t.setCursorPos(1, y + 1)
    else
      t.setCursorPos(1, height)
      t.scroll(1)
    end
    x, y = t.getCursorPos()
    lines = lines + 1
  end
  local pos, n = 1, #text
  while pos <= n do
    local s, e = text:find('^[ \t]+', pos)
    if s then
      t.write(text:sub(s, e))
      x, y = t.getCursorPos()
      pos = e + 1
    end
    if text:sub(pos, pos) == '\n' then
      newLine()
      pos = pos + 1
    end
    s, e = text:find('^[^ \t\n]+', pos)
    if s then
      local word = text:sub(s, e)
      pos = e + 1
      if #word > width then
        while #word > 0 do
          if x > width then newLine() end
          t.write(word)
          word = word:sub(width - x + 2)
          x, y = t.getCursorPos()
        end
      else
        if x + #word - 1 > width then newLine() end
        t.write(word)
        x, y = t.getCursorPos()
      end
    end
  end
  return lines
end

function write(text)
  expect(1, text, 'string', 'number')
  text = tostring(text)
  log(text)
  return draw(text)
end

local function joinArgs(...)
  local n = select('#', ...)
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  return table.concat(parts, '\t')
end

function print(...)
  local text = joinArgs(...) .. '\n'
  log(text)
  return draw(text)
end

function printError(...)
  local text = joinArgs(...) .. '\n'
  host.err(text)
  local t = redirectTarget
  local old
  if t.isColour() then
    old = t.getTextColour()
    t.setTextColour(colors.red)
  end
  draw(text)
  if t.isColour() then t.setTextColour(old) end
end

-- Event queue, processes, multishell tabs ----------------------------------------------
--
-- Each top-level process is a multishell tab: it has its own terminal (a window on the screen,
-- shown while the tab is focused, below a tab bar once there are two tabs), its own
-- term.redirect target, and keyboard events and `terminate` go to the focused tab only.
-- Without multishell, processes share the screen and every event reaches every process.

local QUEUE_LIMIT = 256
local USER_INPUT = {
  char = true, key = true, key_up = true, paste = true, terminate = true, file_transfer = true,
  mouse_click = true, mouse_drag = true, mouse_up = true, mouse_scroll = true,
}
local tabbed = computerOptions.multishell and true or false
local queue = {}
local procs = {}
local current = nil
local focused = nil
local nextPid = 0
local sliceDepth = 0
local menuShown, tabsResized = false, false
local screenWidth, screenHeight = native.getSize()
kernel.dropped = 0

function kernel.enqueue(...)
  if #queue >= QUEUE_LIMIT then
    kernel.dropped = kernel.dropped + 1
    return false
  end
  queue[#queue + 1] = tablePack(...)
  host.wake()
  return true
end

local function indexOf(p)
  for i = 1, #procs do
    if procs[i] == p then return i end
  end
end

local function tabArea()
  if menuShown then return 2, screenHeight - 1 end
  return 1, screenHeight
end

local function redrawMenu()
  if not menuShown then return end
  native.setCursorPos(1, 1)
  native.setBackgroundColour(colors.gray)
  native.clearLine()
  local used = 0
  for _, p in ipairs(procs) do
    if p == focused then
      native.setTextColour(native.isColour() and colors.yellow or colors.white)
      native.setBackgroundColour(colors.black)
    else
      native.setTextColour(colors.black)
      native.setBackgroundColour(colors.gray)
    end
    native.write(' ' .. p.title .. ' ')
    used = used + #p.title + 2
  end
  if used > screenWidth then
    native.setTextColour(colors.black)
    native.setBackgroundColour(colors.gray)
    native.setCursorPos(screenWidth, 1)
    native.write('>')
  end
  if focused then focused.window.restoreCursor() end
end

local function focusTab(p)
  if focused == p then return end
  if focused and not focused.dead then focused.window.setVisible(false) end
  focused = p
  if p then p.window.setVisible(true) end
end

local function showMenu(shown)
  if menuShown == shown then return end
  menuShown = shown
  local top, rows = tabArea()
  for _, p in ipairs(procs) do
    local x, y = p.window.getCursorPos()
    if y > rows then
      p.window.scroll(y - rows)
      p.window.setCursorPos(x, rows)
    end
    p.window.reposition(1, top, screenWidth, rows)
  end
  tabsResized = true
  redrawMenu()
end

local function finish(p, ok, err)
  p.dead = true
  local index = indexOf(p)
  if index then table.remove(procs, index) end
  if tabbed then
    if focused == p then
      focused = nil
      if index and index > 1 then focusTab(procs[index - 1]) elseif procs[1] then focusTab(procs[1]) end
    end
    showMenu(#procs >= 2)
    redrawMenu()
  end
  host.procDone(p.pid, ok, err ~= nil and tostring(err) or nil)
end

local function resume(p, ...)
  local previous, previousTerm = current, redirectTarget
  current, redirectTarget = p, p.terminal
  local ok, result = coResume(p.co, ...)
  p.terminal = redirectTarget
  if not ok and not p.dead then printError(result) end
  current, redirectTarget = previous, previousTerm
  if p.dead then return end
  if not ok then
    finish(p, false, result)
  elseif coStatus(p.co) == 'dead' then
    finish(p, true, nil)
  else
    p.filter = result
  end
end

local function offer(p, event)
  if not p.dead and (p.filter == nil or p.filter == event[1] or event[1] == 'terminate') then
    resume(p, tableUnpack(event, 1, event.n))
  end
end

local function offerAll(event)
  local snapshot = {}
  for i = 1, #procs do snapshot[i] = procs[i] end
  for _, p in ipairs(snapshot) do offer(p, event) end
end

local function abortComputer()
  for _, p in ipairs(procs) do p.dead = true end
  procs, queue, focused = {}, {}, nil
  host.shutdown()
end

-- Run `fn` as (part of) the computer's handling of one event: the yield limit's clock starts
-- when the outermost slice starts.
local function slice(fn, ...)
  sliceDepth = sliceDepth + 1
  if sliceDepth == 1 then
    sliceDeadline, softAborted = clock() + YIELD_LIMIT, false
  end
  local ok, err = nativePcall(fn, ...)
  if sliceDepth == 1 and ok then
    if tabsResized then
      tabsResized = false
      ok, err = nativePcall(offerAll, { 'term_resize', n = 1 })
    end
  end
  sliceDepth = sliceDepth - 1
  if sliceDepth == 0 then
    sliceDeadline = nil
    if hardAborted then abortComputer() end
  end
  if not ok then error(err, 0) end
end

local function spawn(fn, title, focus)
  nextPid = nextPid + 1
  local p = { pid = nextPid, title = title or ('process ' .. nextPid), co = coCreate(fn) }
  installHook(p.co)
  if tabbed then
    showMenu(#procs + 1 >= 2)
    local top, rows = tabArea()
    p.window = window.create(native, 1, top, screenWidth, rows, false)
    p.terminal = {}
    for k in pairs(native) do p.terminal[k] = p.window[k] end
  else
    p.terminal = native
  end
  procs[#procs + 1] = p
  local index = #procs
  if tabbed and (focus or focused == nil) then focusTab(p) end
  slice(function()
    resume(p)
    redrawMenu()
  end)
  return p, index
end

function kernel.spawn(fn, name) return spawn(fn, name).pid end

function kernel.step()
  local event = table.remove(queue, 1)
  if not event then return false end
  slice(function()
    if tabbed and USER_INPUT[event[1]] then
      if focused then offer(focused, event) end
    else
      offerAll(event)
    end
  end)
  return #queue > 0
end

function kernel.processCount() return #procs end
function kernel.queueLength() return #queue end
function kernel.killAll()
  for _, p in ipairs(procs) do p.dead = true end
  procs, queue, focused = {}, {}, nil
end
function kernel.screen() return nativeSnapshot() end
function kernel.tabScreen(pid)
  for _, p in ipairs(procs) do
    if p.pid == pid then
      if not p.window then return nativeSnapshot() end
      local width, height = p.window.getSize()
      local rows = { text = {}, fg = {}, bg = {}, width = width, height = height }
      for row = 1, height do rows.text[row], rows.fg[row], rows.bg[row] = p.window.getLine(row) end
      rows.x, rows.y = p.window.getCursorPos()
      rows.blink = p.window.getCursorBlink()
      return rows
    end
  end
end
function kernel.focus(pid)
  for _, p in ipairs(procs) do
    if p.pid == pid then
      if tabbed then
        focusTab(p)
        redrawMenu()
      end
      return true
    end
  end
  return false
end

-- os --------------------------------------------------------------------------------

local nativeOs = os
os = {}
os.time = function(kind)
  if kind == nil or kind == 'ingame' then return host.ingameTime() end
  return nativeOs.time()
end
os.date = nativeOs.date
os.day = function() return 1 end
function os.epoch(kind)
  kind = kind or 'ingame'
  return host.epoch(kind)
end
function os.clock() return host.clock() end
function os.getComputerID() return computerOptions.id end
os.computerID = os.getComputerID
function os.getComputerLabel() return computerOptions.label end
os.computerLabel = os.getComputerLabel
function os.setComputerLabel(label)
  arg(1, label, 'string', 'nil')
  computerOptions.label = label
  host.setLabel(label)
end
function os.version() return 'CraftOS 1.9' end
function os.queueEvent(name, ...)
  arg(1, name, 'string')
  kernel.enqueue(name, ...)
end
function os.startTimer(seconds)
  arg(1, seconds, 'number')
  return host.startTimer(seconds)
end
function os.cancelTimer(id)
  arg(1, id, 'number')
  host.cancelTimer(id)
end
function os.setAlarm() error('os.setAlarm is not emulated', 2) end
function os.pullEventRaw(filter)
  return coroutine.yield(filter)
end
function os.pullEvent(filter)
  local event = tablePack(os.pullEventRaw(filter))
  if event[1] == 'terminate' then error('Terminated', 0) end
  return tableUnpack(event, 1, event.n)
end
function sleep(seconds)
  expect(1, seconds, 'number', 'nil')
  local id = os.startTimer(seconds or 0)
  repeat
    local _, timer = os.pullEvent('timer')
  until timer == id
end
function os.sleep(seconds) sleep(seconds) end
function os.shutdown()
  host.shutdown()
  while true do coroutine.yield() end
end
function os.reboot() os.shutdown() end

-- fs --------------------------------------------------------------------------------
--
-- The disk lives in Python (craftos.Disk): CC:Tweaked's paths, space accounting, handles and
-- messages. A failing call answers (false, message); these wrappers raise it (or return it, as
-- fs.open does).

fs = {}
local function raise(ok, result)
  if not ok then error(result, 3) end
  return result
end
local function sanitise(path) return host.fsSanitize(path, true) end

function fs.combine(...)
  local n = select('#', ...)
  local first = arg(1, (...), 'string')
  local result = sanitise(first)
  for i = 2, n do
    local part = sanitise(arg(i, (select(i, ...)), 'string'))
    if result ~= '' and part ~= '' then result = result .. '/' end
    result = result .. part
  end
  return sanitise(result)
end
function fs.getName(path)
  local p = sanitise(arg(1, path, 'string'))
  if p == '' then return 'root' end
  return p:match('([^/]*)$')
end
function fs.getDir(path)
  local p = sanitise(arg(1, path, 'string'))
  if p == '' then return '..' end
  local last = p:match('([^/]*)$')
  if last == '..' then return p .. '/..' end
  return p:match('^(.*)/[^/]*$') or ''
end
function fs.exists(path) return host.fsExists(arg(1, path, 'string')) end
function fs.isDir(path) return host.fsIsDir(arg(1, path, 'string')) end
function fs.isReadOnly(path) return host.fsIsReadOnly(arg(1, path, 'string')) end
-- One path in, one value (or CraftOS's error) out.
for name, hostName in pairs({
  getSize = 'fsSize', attributes = 'fsAttributes', getDrive = 'fsDrive',
  getFreeSpace = 'fsFreeSpace', getCapacity = 'fsCapacity',
}) do
  local call = host[hostName]
  fs[name] = function(path)
    local result = raise(call(arg(1, path, 'string')))
    return result
  end
end
function fs.list(path)
  local names = raise(host.fsList(arg(1, path, 'string')))
  local out = {}
  for i = 1, #names do out[i] = names[i] end
  return out
end
function fs.makeDir(path) raise(host.fsMakeDir(arg(1, path, 'string'))) end
function fs.delete(path) raise(host.fsDelete(arg(1, path, 'string'))) end
function fs.move(from, to)
  raise(host.fsMove(arg(1, from, 'string'), arg(2, to, 'string')))
end
function fs.copy(from, to)
  raise(host.fsCopy(arg(1, from, 'string'), arg(2, to, 'string')))
end
function fs.isDriveRoot(path)
  arg(1, path, 'string')
  return fs.getDir(path) == '..' or fs.getDrive(path) ~= fs.getDrive(fs.getDir(path))
end
function fs.find(pattern)
  arg(1, pattern, 'string')
  pattern = sanitise(pattern)
  local results = {}
  local function walk(dir, parts, i)
    local part = parts[i]
    if not part then
      results[#results + 1] = dir
      return
    end
    if not part:find('[*?]') then
      local path = dir == '' and part or dir .. '/' .. part
      if fs.exists(path) then walk(path, parts, i + 1) end
      return
    end
    if not fs.isDir(dir) then return end
    local lua = '^' .. part:gsub('[%^%$%(%)%%%.%[%]%+%-]', '%%%0'):gsub('%*', '.*'):gsub('%?', '.') .. '$'
    for _, name in ipairs(fs.list(dir)) do
      if name:find(lua) then walk(dir == '' and name or dir .. '/' .. name, parts, i + 1) end
    end
  end
  local parts = {}
  for part in pattern:gmatch('[^/]+') do parts[#parts + 1] = part end
  if #parts > 0 then walk('', parts, 1) end
  table.sort(results)
  return results
end

local function checkOpen(state)
  if state.closed then error('attempt to use a closed file', 3) end
end

-- A handle over a Python file (AbstractHandle): reading and writing bytes, `read()` a byte as a
-- number in binary mode.
local function makeHandle(id, binary, readable, writable, seekable)
  local state = { closed = false }
  local h = {}
  function h.close()
    checkOpen(state)
    state.closed = true
    host.fsClose(id)
  end
  if readable then
    function h.read(count)
      checkOpen(state)
      if count == nil then
        local byte = host.fsRead(id, 1)
        if byte == nil then return nil end
        if binary then return byte:byte() end
        return byte
      end
      count = argInt(1, count)
      if count < 0 then error('Cannot read a negative number of bytes', 2) end
      if count == 0 then
        local pos = host.fsSeek(id, 'cur', 0)
        local size = host.fsSeek(id, 'end', 0)
        host.fsSeek(id, 'set', pos)
        if pos >= size then return nil end
        return ''
      end
      return host.fsRead(id, count)
    end
    function h.readAll()
      checkOpen(state)
      return host.fsReadAll(id)
    end
    function h.readLine(withTrailing)
      checkOpen(state)
      arg(1, withTrailing, 'boolean', 'nil')
      return host.fsReadLine(id, withTrailing or false)
    end
  end
  if writable then
    function h.write(value)
      checkOpen(state)
      local data
      if binary and type(value) == 'number' then
        data = string.char(argInt(1, value) % 256)
      else
        data = coerceString(value)
      end
      local ok, err = host.fsWrite(id, data)
      if not ok then error(err, 2) end
    end
    function h.writeLine(value)
      checkOpen(state)
      local ok, err = host.fsWrite(id, coerceString(value) .. '\n')
      if not ok then error(err, 2) end
    end
    function h.flush() checkOpen(state) end
  end
  if seekable then
    function h.seek(whence, offset)
      checkOpen(state)
      arg(1, whence, 'string', 'nil')
      if offset ~= nil then offset = argInt(2, offset) end
      whence = whence or 'cur'
      if whence ~= 'set' and whence ~= 'cur' and whence ~= 'end' then
        error("bad argument #1 to 'seek' (invalid option '" .. whence .. "')", 2)
      end
      local pos = host.fsSeek(id, whence, offset or 0)
      if pos == nil then return nil, 'Position is negative' end
      return pos
    end
  end
  return h
end

local OPEN_MODES = {
  r = { false, true, false, true }, rb = { true, true, false, true },
  w = { false, false, true, true }, wb = { true, false, true, true },
  a = { false, false, true, false }, ab = { true, false, true, false },
  ['r+'] = { false, true, true, true }, ['r+b'] = { true, true, true, true },
  ['w+'] = { false, true, true, true }, ['w+b'] = { true, true, true, true },
}
function fs.open(path, mode)
  arg(1, path, 'string')
  arg(2, mode, 'string')
  local flags = OPEN_MODES[mode]
  if not flags then error('Unsupported mode', 2) end
  local ok, id = host.fsOpen(path, (mode:gsub('b', '')))
  if not ok then return nil, id end
  return makeHandle(id, flags[1], flags[2], flags[3], flags[4])
end

-- Loading code ----------------------------------------------------------------------

function load(chunk, name, mode, env)
  return nativeLoad(chunk, name, 't', env or _G)
end
function loadfile(filename, mode, env)
  if type(mode) == 'table' and env == nil then mode, env = nil, mode end
  expect(1, filename, 'string')
  expect(2, mode, 'string', 'nil')
  expect(3, env, 'table', 'nil')
  local file = fs.open(filename, 'r')
  if not file then return nil, 'File not found' end
  local fn, err = load(file.readAll(), '@/' .. fs.combine(filename), mode, env)
  file.close()
  return fn, err
end
function dofile(filename)
  expect(1, filename, 'string')
  local fn, err = loadfile(filename, nil, _G)
  if not fn then error(err, 2) end
  return fn()
end

-- textutils -------------------------------------------------------------------------

textutils = {}

local LUA_KEYWORDS = {}
for word in ('and break do else elseif end false for function goto if in local nil not or repeat return then true until while'):gmatch('%S+') do
  LUA_KEYWORDS[word] = true
end

-- Cobalt's %q: only ", \, newline, \r and \0 are escaped.
local function quote(s)
  return '"' .. s:gsub('[\\"\n\r%z]', { ['\\'] = '\\\\', ['"'] = '\\"', ['\n'] = '\\\n', ['\r'] = '\\r', ['\0'] = '\\000' }) .. '"'
end

local keyOrder = { number = 1, string = 2, boolean = 3 }
local function compareKeys(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return (keyOrder[ta] or 9) < (keyOrder[tb] or 9) end
  if ta == 'number' or ta == 'string' then return a < b end
  return tostring(a) < tostring(b)
end

local function serializeValue(value, tracking, indent, opts)
  local t = type(value)
  if t == 'table' then
    if tracking[value] ~= nil then
      if tracking[value] == false then error('Cannot serialize table with repeated entries', 0) end
      error('Cannot serialize table with recursive entries', 0)
    end
    tracking[value] = true
    local result
    if next(value) == nil then
      result = '{}'
    else
      local open, inner, openKey, closeKey, equals, comma = '{\n', indent .. '  ', '[ ', ' ] = ', ' = ', ',\n'
      if opts.compact then open, inner, openKey, closeKey, equals, comma = '{', '', '[', ']=', '=', ',' end
      local parts = { open }
      local inArray = {}
      local i = 1
      while rawget(value, i) ~= nil do
        inArray[i] = true
        parts[#parts + 1] = inner .. serializeValue(rawget(value, i), tracking, inner, opts) .. comma
        i = i + 1
      end
      local others = {}
      for k in next, value do
        if not inArray[k] then others[#others + 1] = k end
      end
      table.sort(others, compareKeys)
      for _, k in ipairs(others) do
        local v = rawget(value, k)
        if type(k) == 'string' and not LUA_KEYWORDS[k] and k:match('^[%a_][%w_]*$') then
          parts[#parts + 1] = inner .. k .. equals .. serializeValue(v, tracking, inner, opts) .. comma
        else
          parts[#parts + 1] = inner .. openKey .. serializeValue(k, tracking, inner, opts) .. closeKey
            .. serializeValue(v, tracking, inner, opts) .. comma
        end
      end
      parts[#parts + 1] = indent .. '}'
      result = table.concat(parts)
    end
    if opts.allow_repetitions then tracking[value] = nil else tracking[value] = false end
    return result
  elseif t == 'string' then
    return quote(value)
  elseif t == 'number' then
    if value ~= value then return '0/0' end
    if value == math.huge then return '1/0' end
    if value == -math.huge then return '-1/0' end
    return tostring(value)
  elseif t == 'boolean' or t == 'nil' then
    return tostring(value)
  end
  error('Cannot serialize type ' .. t, 0)
end

function textutils.serialize(value, opts)
  expect(2, opts, 'table', 'nil')
  opts = opts or {}
  if opts.compact ~= nil and type(opts.compact) ~= 'boolean' then
    error("bad field 'compact' (boolean expected, got " .. type(opts.compact) .. ')', 2)
  end
  if opts.allow_repetitions ~= nil and type(opts.allow_repetitions) ~= 'boolean' then
    error("bad field 'allow_repetitions' (boolean expected, got " .. type(opts.allow_repetitions) .. ')', 2)
  end
  return serializeValue(value, {}, '', opts)
end
textutils.serialise = textutils.serialize
function textutils.unserialize(s)
  expect(1, s, 'string')
  local fn = nativeLoad('return ' .. s, 'unserialize', 't', {})
  if fn then
    local ok, value = pcall(fn)
    if ok then return value end
  end
  return nil
end
textutils.unserialise = textutils.unserialize
function textutils.urlEncode(s)
  expect(1, s, 'string')
  return (s:gsub('\n', '\r\n'):gsub('[^A-Za-z0-9%-_%.]', function(c)
    if c == ' ' then return '+' end
    local n = c:byte()
    if n < 128 then return ('%%%02X'):format(n) end
    return ('%%%02X%%%02X'):format(192 + floor(n / 64) % 32, 128 + n % 64)
  end))
end

local function frozen(str, name)
  return setmetatable({}, {
    __newindex = function() error('attempt to mutate textutils.' .. name, 2) end,
    __tostring = function() return str end,
  })
end
textutils.empty_json_array = frozen('[]', 'empty_json_array')
textutils.json_null = frozen('null', 'json_null')

local jsonEscapes = {}
for i = 0, 255 do
  local c = string.char(i)
  if i < 32 or i >= 127 then jsonEscapes[c] = ('\\u00%02X'):format(i) end
end
jsonEscapes['"'] = '\\"'
jsonEscapes['\\'] = '\\\\'
jsonEscapes['\b'] = '\\b'
jsonEscapes['\f'] = '\\f'
jsonEscapes['\n'] = '\\n'
jsonEscapes['\r'] = '\\r'
jsonEscapes['\t'] = '\\t'

local function jsonString(s)
  return '"' .. s:gsub('[\0-\31"\\\127-\255]', jsonEscapes) .. '"'
end

local function toJson(value, seen)
  local t = type(value)
  if value == textutils.empty_json_array then return '[]' end
  if value == textutils.json_null then return 'null' end
  if t == 'string' then return jsonString(value) end
  if t == 'number' or t == 'boolean' then return tostring(value) end
  if t ~= 'table' then error('Cannot serialize type ' .. t, 0) end
  if seen[value] then error('Cannot serialize table with recursive entries', 0) end
  seen[value] = true
  local result
  if next(value) == nil then
    result = '{}'
  else
    local objectParts, largest = {}, 0
    for k, v in pairs(value) do
      if type(k) == 'string' then
        objectParts[#objectParts + 1] = jsonString(k) .. ':' .. toJson(v, seen)
      elseif type(k) == 'number' and k > largest then
        largest = k
      end
    end
    if #objectParts > 0 or largest == 0 then
      result = '{' .. table.concat(objectParts, ',') .. '}'
    else
      local arrayParts = {}
      for i = 1, largest do
        arrayParts[i] = value[i] == nil and 'null' or toJson(value[i], seen)
      end
      result = '[' .. table.concat(arrayParts, ',') .. ']'
    end
  end
  seen[value] = nil
  return result
end

function textutils.serializeJSON(value, options)
  expect(1, value, 'table', 'string', 'number', 'boolean')
  return toJson(value, {})
end
textutils.serialiseJSON = textutils.serializeJSON

local function utf8Char(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then
    return string.char(0xC0 + math.floor(code / 64), 0x80 + code % 64)
  end
  return string.char(0xE0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
end

local JsonError = {}
local function jsonFail(pos, msg) error(setmetatable({ pos = pos, msg = msg }, JsonError), 0) end

local function skipWs(s, pos)
  local _, last = s:find('^[ \n\r\t]+', pos)
  return last and last + 1 or pos
end

local simpleEscapes = { b = '\b', f = '\f', n = '\n', r = '\r', t = '\t', ['"'] = '"', ['/'] = '/', ['\\'] = '\\' }

local function parseString(s, pos)
  local buf = {}
  while true do
    local c = s:sub(pos, pos)
    if c == '' then jsonFail(pos, "Unexpected end of input, expected '\"'.") end
    if c == '"' then return table.concat(buf), pos + 1 end
    if c == '\\' then
      local e = s:sub(pos + 1, pos + 1)
      if e == 'u' then
        local hex = s:match('^%x%x%x%x', pos + 2)
        if not hex then jsonFail(pos, 'Malformed unicode escape.') end
        buf[#buf + 1] = utf8Char(tonumber(hex, 16))
        pos = pos + 6
      elseif simpleEscapes[e] then
        buf[#buf + 1] = simpleEscapes[e]
        pos = pos + 2
      else
        jsonFail(pos + 1, ('Unknown escape character %q.'):format(e))
      end
    elseif c < ' ' then
      jsonFail(pos, ('Unescaped whitespace %q.'):format(c))
    else
      local _, finish = s:find('^[^"\\%c]+', pos)
      finish = finish or pos
      buf[#buf + 1] = s:sub(pos, finish)
      pos = finish + 1
    end
  end
end

local parseValue
function parseValue(s, pos, opts)
  pos = skipWs(s, pos)
  local c = s:sub(pos, pos)
  if c == '"' then return parseString(s, pos + 1) end
  if c == '{' then
    local obj = {}
    pos = skipWs(s, pos + 1)
    if s:sub(pos, pos) == '}' then return obj, pos + 1 end
    while true do
      if s:sub(pos, pos) ~= '"' then jsonFail(pos, 'Unexpected character, expected object key.') end
      local key
      key, pos = parseString(s, pos + 1)
      pos = skipWs(s, pos)
      if s:sub(pos, pos) ~= ':' then jsonFail(pos, "Unexpected character, expected ':'.") end
      local value
      value, pos = parseValue(s, pos + 1, opts)
      obj[key] = value
      pos = skipWs(s, pos)
      local d = s:sub(pos, pos)
      if d == '}' then return obj, pos + 1 end
      if d ~= ',' then jsonFail(pos, "Unexpected character, expected ',' or '}'.") end
      pos = skipWs(s, pos + 1)
    end
  end
  if c == '[' then
    local arr, n = {}, 0
    pos = skipWs(s, pos + 1)
    if s:sub(pos, pos) == ']' then
      if opts.parse_empty_array == false then return {}, pos + 1 end
      return textutils.empty_json_array, pos + 1
    end
    while true do
      local value
      value, pos = parseValue(s, pos, opts)
      n = n + 1
      arr[n] = value
      pos = skipWs(s, pos)
      local d = s:sub(pos, pos)
      if d == ']' then return arr, pos + 1 end
      if d ~= ',' then jsonFail(pos, "Unexpected character, expected ',' or ']'.") end
      pos = pos + 1
    end
  end
  if s:sub(pos, pos + 3) == 'true' then return true, pos + 4 end
  if s:sub(pos, pos + 4) == 'false' then return false, pos + 5 end
  if s:sub(pos, pos + 3) == 'null' then
    if opts.parse_null then return textutils.json_null, pos + 4 end
    return nil, pos + 4
  end
  if c == '-' or c:match('%d') then
    local _, last, num = s:find('^(-?%d+%.?%d*[eE]?[+-]?%d*)', pos)
    local value = tonumber(num)
    if not value then jsonFail(pos, 'Malformed number.') end
    return value, last + 1
  end
  if c == '' then jsonFail(pos, 'Unexpected end of input.') end
  jsonFail(pos, ('Unexpected character %q.'):format(c))
end

function textutils.unserializeJSON(s, options)
  expect(1, s, 'string')
  expect(2, options, 'table', 'nil')
  local ok, value, pos = nativePcall(parseValue, s, 1, options or {})
  if not ok then
    if getmetatable(value) == JsonError then
      return nil, ('Malformed JSON at position %d: %s'):format(value.pos, value.msg)
    end
    error(value, 0)
  end
  pos = skipWs(s, pos)
  if pos <= #s then
    return nil, ('Malformed JSON at position %d: Unexpected trailing character.'):format(pos)
  end
  return value
end
textutils.unserialiseJSON = textutils.unserializeJSON

-- settings ------------------------------------------------------------------

settings = {}
local settingValues, settingDetails = {}, {}
function settings.define(name, options)
  expect(1, name, 'string')
  expect(2, options, 'table', 'nil')
  settingDetails[name] = options or {}
end
function settings.undefine(name) settingDetails[name] = nil end
function settings.set(name, value)
  expect(1, name, 'string')
  local d = settingDetails[name]
  if d and d.type and type(value) ~= d.type then
    error(('bad argument #2 (expected %s, got %s)'):format(d.type, type(value)), 2)
  end
  settingValues[name] = value
end
function settings.get(name, default)
  expect(1, name, 'string')
  local v = settingValues[name]
  if v ~= nil then return v end
  if default ~= nil then return default end
  local d = settingDetails[name]
  return d and d.default
end
function settings.getDetails(name)
  local d = settingDetails[name] or {}
  return { description = d.description, default = d.default, type = d.type, value = settingValues[name] }
end
function settings.unset(name) settingValues[name] = nil end
function settings.clear() settingValues = {} end
function settings.getNames()
  local names = {}
  for k in pairs(settingValues) do names[#names + 1] = k end
  for k in pairs(settingDetails) do if settingValues[k] == nil then names[#names + 1] = k end end
  table.sort(names)
  return names
end
function settings.load(path)
  local h = fs.open(path or '.settings', 'r')
  if not h then return false end
  local values = textutils.unserialize(h.readAll())
  h.close()
  if type(values) ~= 'table' then return false end
  for k, v in pairs(values) do settingValues[k] = v end
  return true
end
function settings.save(path)
  local h = fs.open(path or '.settings', 'w')
  if not h then return false end
  h.write(textutils.serialize(settingValues))
  h.close()
  return true
end
settings.load('.settings')


-- parallel ----------------------------------------------------------------------------

parallel = {}
local function routines(...)
  local fns = tablePack(...)
  local cos = {}
  for i = 1, fns.n do
    local fn = fns[i]
    if type(fn) ~= 'function' then
      error('bad argument #' .. i .. ' (function expected, got ' .. type(fn) .. ')', 3)
    end
    cos[i] = coroutine.create(fn)
  end
  return cos
end
local function runUntil(cos, limit)
  local count = #cos
  if count < 1 then return 0 end
  local living = count
  local filters = {}
  local event = { n = 0 }
  while true do
    for i = 1, count do
      local co = cos[i]
      if co and (filters[co] == nil or filters[co] == event[1] or event[1] == 'terminate') then
        local ok, result = coroutine.resume(co, tableUnpack(event, 1, event.n))
        if not ok then error(result, 0) end
        filters[co] = result
        if coStatus(co) == 'dead' then
          cos[i] = false
          living = living - 1
          if living <= limit then return i end
        end
      end
    end
    event = tablePack(os.pullEventRaw())
  end
end
function parallel.waitForAny(...)
  local cos = routines(...)
  return runUntil(cos, #cos - 1)
end
function parallel.waitForAll(...)
  local cos = routines(...)
  runUntil(cos, 0)
end

-- http ------------------------------------------------------------------------

local function makeResponse(code, body, headers)
  local pos = 1
  local h = {}
  function h.getResponseCode() return code end
  function h.getResponseHeaders() return headers or {} end
  function h.readAll()
    local rest = body:sub(pos)
    pos = #body + 1
    return rest
  end
  function h.readLine()
    if pos > #body then return nil end
    local s, e = body:find('\n', pos, true)
    local line
    if s then line = body:sub(pos, s - 1); pos = e + 1 else line = body:sub(pos); pos = #body + 1 end
    return line
  end
  function h.close() end
  return h
end
kernel.makeResponse = makeResponse

local function makeWebsocket(sid, url)
  local closed = false
  local h = {}
  function h.send(message, binary)
    if closed then error('attempt to use a closed file', 2) end
    expect(1, message, 'string')
    local ok, err = host.wsSend(sid, message, binary and true or false)
    if not ok then error(err, 2) end
  end
  function h.receive(timeout)
    if closed then error('attempt to use a closed file', 2) end
    local timer = timeout and os.startTimer(timeout)
    while true do
      local event, a, b, c = os.pullEvent()
      if event == 'websocket_message' and a == url then return b, c end
      if event == 'websocket_closed' and a == url then return nil end
      if event == 'timer' and a == timer then return nil end
    end
  end
  function h.close()
    host.wsClose(sid, closed)
    closed = true
  end
  return h
end
kernel.makeWebsocket = makeWebsocket

if computerOptions.http then
  http = {}
  local function requestArgs(url, body, headers, binary)
    if type(url) == 'table' then
      return url.url, url.body, url.headers, url.binary, url.method
    end
    return url, body, headers, binary, nil
  end
  function http.request(...)
    local url, body, headers, _, method = requestArgs(...)
    expect(1, url, 'string')
    local ok, err = host.httpRequest(url, method or (body and 'POST' or 'GET'), body, headers)
    if not ok then
      os.queueEvent('http_failure', url, err)
      return false, err
    end
    return true
  end
  local function blocking(url, body, headers, binary, method)
    local ok, err = http.request({ url = url, body = body, headers = headers, binary = binary, method = method })
    if not ok then return nil, err end
    while true do
      local event, u, a, b = os.pullEvent()
      if event == 'http_success' and u == url then return a end
      if event == 'http_failure' and u == url then return nil, a, b end
    end
  end
  function http.get(...)
    local url, _, headers, binary, method = requestArgs(...)
    expect(1, url, 'string')
    return blocking(url, nil, headers, binary, method or 'GET')
  end
  function http.post(...)
    local url, body, headers, binary, method = requestArgs(...)
    return blocking(url, body, headers, binary, method or 'POST')
  end
  function http.checkURL(url) return type(url) == 'string' and url:find('^https?://') ~= nil end
  function http.websocketAsync(url, headers)
    expect(1, url, 'string')
    expect(2, headers, 'table', 'nil')
    local ok, err = host.wsOpen(url, headers)
    if not ok then
      os.queueEvent('websocket_failure', url, err)
      return false, err
    end
    return true
  end
  function http.websocket(url, headers)
    local ok, err = http.websocketAsync(url, headers)
    if not ok then return false, err end
    while true do
      local event, u, a = os.pullEvent()
      if event == 'websocket_success' and u == url then return a end
      if event == 'websocket_failure' and u == url then return false, a end
    end
  end
end


-- shell, multishell, programs -------------------------------------------------------------

local DEFAULT_PATH = '.:/rom/programs:/rom/programs/http'
if native.isColour() then DEFAULT_PATH = DEFAULT_PATH .. ':/rom/programs/advanced' end
DEFAULT_PATH = DEFAULT_PATH .. ':/rom/programs/rednet:/rom/programs/fun'
if native.isColour() then DEFAULT_PATH = DEFAULT_PATH .. ':/rom/programs/fun/advanced' end

local multishellApi

local function makeRequire(env, dir)
  local loaded = {}
  local function findModule(name)
    local rel = name:gsub('%.', '/')
    for _, pattern in ipairs({ '?', '?.lua', '?/init.lua', '/rom/modules/main/?', '/rom/modules/main/?.lua', '/rom/modules/main/?/init.lua' }) do
      local candidate = pattern:gsub('%?', rel)
      if candidate:sub(1, 1) ~= '/' then candidate = fs.combine(dir, candidate) end
      if fs.exists(candidate) and not fs.isDir(candidate) then return candidate end
    end
  end
  local package = {
    loaded = loaded,
    path = '?;?.lua;?/init.lua;/rom/modules/main/?;/rom/modules/main/?.lua;/rom/modules/main/?/init.lua',
  }
  local function requireFn(name)
    expect(1, name, 'string')
    if loaded[name] ~= nil then return loaded[name] end
    local path = findModule(name)
    if not path then error(("module '%s' not found"):format(name), 2) end
    local fn, err = loadfile(path, nil, env)
    if not fn then error(err, 2) end
    local result = fn(name, path)
    if result == nil then result = true end
    loaded[name] = result
    return result
  end
  return requireFn, package
end

local function tokenise(...)
  local line = table.concat({ ... }, ' ')
  local words, quoted = {}, false
  for match in (line .. '"'):gmatch('(.-)"') do
    if quoted then
      words[#words + 1] = match
    else
      for word in match:gmatch('[^ \t]+') do words[#words + 1] = word end
    end
    quoted = not quoted
  end
  return words
end

-- cc.internal.exception.try: run a program in its own coroutine, passing events through.
local function try(fn, ...)
  local co = coroutine.create(fn)
  local result = tablePack(coroutine.resume(co, ...))
  while coStatus(co) ~= 'dead' do
    local event = tablePack(os.pullEventRaw(result[2]))
    if result[2] == nil or event[1] == result[2] or event[1] == 'terminate' then
      result = tablePack(coroutine.resume(co, tableUnpack(event, 1, event.n)))
    end
  end
  if not result[1] then return false, result[2], co end
  return tableUnpack(result, 1, result.n)
end

function os.run(env, path, ...)
  expect(1, env, 'table')
  expect(2, path, 'string')
  setmetatable(env, { __index = _G })
  local fn, err = loadfile(path, nil, env)
  if fn then
    local ok, runErr = pcall(fn, ...)
    if not ok then
      if runErr and runErr ~= '' then printError(runErr) end
      return false
    end
    return true
  end
  if err and err ~= '' then printError(err) end
  return false
end

local loadingApis = {}
function os.loadAPI(path)
  expect(1, path, 'string')
  local name = fs.getName(path)
  if name:sub(-4) == '.lua' then name = name:sub(1, -5) end
  if loadingApis[name] then
    printError('API ' .. name .. ' is already being loaded')
    return false
  end
  loadingApis[name] = true
  local env = setmetatable({}, { __index = _G })
  local fn, err = loadfile(path, nil, env)
  if fn then
    local ok, runErr = pcall(fn)
    if not ok then
      loadingApis[name] = nil
      error('Failed to load API ' .. name .. ' due to ' .. tostring(runErr), 1)
    end
  else
    loadingApis[name] = nil
    error('Failed to load API ' .. name .. ' due to ' .. tostring(err), 1)
  end
  local api = {}
  for k, v in pairs(env) do
    if k ~= '_ENV' then api[k] = v end
  end
  _G[name] = api
  loadingApis[name] = nil
  return true
end
function os.unloadAPI(name)
  expect(1, name, 'string')
  if name ~= '_G' and type(_G[name]) == 'table' then _G[name] = nil end
end

local newShell

-- rom/programs/shell.lua's API: a shell inherits its parent's directory, path and aliases.
function newShell(parent)
  local sh = {}
  local dir = parent and parent.dir() or ''
  local path = parent and parent.path() or DEFAULT_PATH
  local aliases = parent and parent.aliases() or {}
  local completion = {}
  local stack = {}

  local function programEnv(programDir)
    local env = { shell = sh, multishell = multishellApi }
    env.require, env.package = makeRequire(env, programDir)
    return env
  end
  local function setTitle(title)
    if multishellApi and current then multishellApi.setTitle(multishellApi.getCurrent(), title) end
  end
  local function programTitle(programPath)
    local title = fs.getName(programPath)
    if title:sub(-4) == '.lua' then title = title:sub(1, -5) end
    return title
  end

  local function execute(depth, programPath, args)
    local file, err = fs.open(programPath, 'r')
    if not file then
      printError(err)
      return false
    end
    local first = file.readLine() or ''
    if first:sub(1, 2) == '#!' then
      file.close()
      depth = depth - 1
      if depth == 0 then
        printError('Hashbang recursion depth limit reached when loading file: ' .. programPath)
        return false
      end
      local words = tokenise(first:sub(3))
      local program = table.remove(words, 1)
      local resolved = sh.resolveProgram(program)
      if not resolved then
        printError('Hashbang program not found: ' .. program)
        return false
      end
      words[#words + 1] = programPath
      for _, v in ipairs(args) do words[#words + 1] = v end
      words[0] = program
      return execute(depth, resolved, words)
    end
    local contents = first .. '\n' .. (file.readAll() or '')
    file.close()
    local env = setmetatable(programEnv(fs.getDir(programPath)), { __index = _G })
    env.arg = args
    local fn, loadErr = load(contents, '@/' .. programPath, nil, env)
    if not fn then
      printError(loadErr)
      return false
    end
    local ok, runErr = try(fn, tableUnpack(args, 1, args.n))
    if ok then return true end
    if runErr and runErr ~= '' then printError(runErr) end
    return false
  end

  function sh.execute(command, ...)
    expect(1, command, 'string')
    for i = 1, select('#', ...) do expect(i + 1, (select(i, ...)), 'string') end
    local programPath = sh.resolveProgram(command)
    if programPath == nil then
      printError('No such program')
      return false
    end
    stack[#stack + 1] = programPath
    setTitle(programTitle(programPath))
    local args = tablePack(...)
    args[0] = command
    local result = execute(100, programPath, args)
    stack[#stack] = nil
    setTitle(#stack > 0 and programTitle(stack[#stack]) or 'shell')
    return result
  end
  function sh.run(...)
    local words = tokenise(...)
    if not words[1] then return false end
    return sh.execute(tableUnpack(words))
  end
  function sh.exit() end
  function sh.dir() return dir end
  function sh.setDir(newDir)
    expect(1, newDir, 'string')
    if not fs.isDir(newDir) then error('Not a directory', 2) end
    dir = fs.combine(newDir, '')
  end
  function sh.path() return path end
  function sh.setPath(newPath)
    expect(1, newPath, 'string')
    path = newPath
  end
  function sh.resolve(p)
    expect(1, p, 'string')
    local c = p:sub(1, 1)
    if c == '/' or c == '\\' then return fs.combine('', p) end
    return fs.combine(dir, p)
  end
  local function withLua(p)
    local last = p:sub(-1)
    if last == '/' or last == '\\' then p = p:sub(1, -2) end
    return p .. '.lua'
  end
  local function programAt(p)
    if fs.exists(p) and not fs.isDir(p) then return p end
    local lua = withLua(p)
    if fs.exists(lua) and not fs.isDir(lua) then return lua end
  end
  function sh.resolveProgram(command)
    expect(1, command, 'string')
    if aliases[command] ~= nil then command = aliases[command] end
    if command:find('/') or command:find('\\') then return programAt(sh.resolve(command)) end
    for entry in path:gmatch('[^:]+') do
      local found = programAt(fs.combine(sh.resolve(entry), command))
      if found then return found end
    end
    return nil
  end
  function sh.programs(includeHidden)
    expect(1, includeHidden, 'boolean', 'nil')
    local seen = {}
    for entry in path:gmatch('[^:]+') do
      local p = sh.resolve(entry)
      if fs.isDir(p) then
        for _, name in ipairs(fs.list(p)) do
          if not fs.isDir(fs.combine(p, name)) and (includeHidden or name:sub(1, 1) ~= '.') then
            if #name > 4 and name:sub(-4) == '.lua' then name = name:sub(1, -5) end
            seen[name] = true
          end
        end
      end
    end
    local names = {}
    for name in pairs(seen) do names[#names + 1] = name end
    table.sort(names)
    return names
  end
  function sh.aliases()
    local copy = {}
    for k, v in pairs(aliases) do copy[k] = v end
    return copy
  end
  function sh.setAlias(name, program)
    expect(1, name, 'string')
    expect(2, program, 'string')
    aliases[name] = program
  end
  function sh.clearAlias(name)
    expect(1, name, 'string')
    aliases[name] = nil
  end
  function sh.getRunningProgram() return stack[#stack] end
  function sh.setCompletionFunction(program, fn)
    expect(1, program, 'string')
    expect(2, fn, 'function', 'nil')
    completion[program] = fn and { fnComplete = fn } or nil
  end
  function sh.getCompletionInfo() return completion end
  function sh.complete() return nil end
  function sh.completeProgram() return {} end
  if multishellApi then
    function sh.openTab(...)
      local words = tokenise(...)
      local command = words[1]
      if not command then return end
      if not sh.resolveProgram(command) then
        printError('No such program')
        return
      end
      local child = newShell(sh)
      local _, index = spawn(function() child.run(tableUnpack(words)) end, 'shell')
      return index
    end
    function sh.switchTab(id)
      expect(1, id, 'number')
      multishellApi.setFocus(id)
    end
  end
  return sh
end

if tabbed then
  multishellApi = {}
  function multishellApi.getCurrent() return indexOf(current) end
  function multishellApi.getCount() return #procs end
  function multishellApi.getFocus() return indexOf(focused) end
  function multishellApi.setFocus(n)
    expect(1, n, 'number')
    if n >= 1 and n <= #procs then
      focusTab(procs[n])
      redrawMenu()
      return true
    end
    return false
  end
  function multishellApi.getTitle(n)
    expect(1, n, 'number')
    if n >= 1 and n <= #procs then return procs[n].title end
  end
  function multishellApi.setTitle(n, title)
    expect(1, n, 'number')
    expect(2, title, 'string')
    if n >= 1 and n <= #procs then
      procs[n].title = title
      redrawMenu()
    end
  end
  function multishellApi.launch(env, path, ...)
    expect(1, env, 'table')
    expect(2, path, 'string')
    local args = tablePack(...)
    local _, index = spawn(function() os.run(env, path, tableUnpack(args, 1, args.n)) end, fs.getName(path))
    return index
  end
  multishell = multishellApi
end

-- read(): a line typed (or pasted) into the focused process, drawn as it is typed (each char,
-- paste and backspace shows at once, as CraftOS's read() does: a console or `attach` watching
-- the screen sees the key), then a new line when Enter is pressed.
function read(replaceChar)
  expect(1, replaceChar, 'string', 'nil')
  if replaceChar then replaceChar = replaceChar:sub(1, 1) end
  local buffer = ''
  local startX, startY = term.getCursorPos()
  term.setCursorBlink(true)
  local function redraw(previous)
    term.setCursorPos(startX, startY)
    term.write(replaceChar and rep(replaceChar, #buffer) or buffer)
    if previous > #buffer then term.write(rep(' ', previous - #buffer)) end
    term.setCursorPos(startX + #buffer, startY)
  end
  while true do
    local event, a = os.pullEvent()
    if event == 'paste' or event == 'char' then
      buffer = buffer .. a
      term.write(replaceChar and rep(replaceChar, #a) or a)
    elseif event == 'key' and (a == keys.enter or a == keys.numPadEnter) then
      term.setCursorBlink(false)
      print()
      return buffer
    elseif event == 'key' and a == keys.backspace and #buffer > 0 then
      buffer = buffer:sub(1, -2)
      redraw(#buffer + 1)
    end
  end
end

-- Kernel entry points used by Python ------------------------------------------------

-- The shell of the first tab: startup runs in it, and other processes start from it (as a tab
-- opened from that shell would), so they see the aliases and path startup set.
local rootShell = newShell(nil)

local function makeEnv(sh, dir)
  local env = setmetatable({ shell = sh, multishell = multishellApi }, { __index = _G })
  env.require, env.package = makeRequire(env, dir or '')
  return env
end

function kernel.runCommand(line)
  local sh = newShell(rootShell)
  return kernel.spawn(function() sh.run(line) end, 'shell')
end

function kernel.runLua(code, name)
  local fn, err = nativeLoad(code, '=' .. (name or 'harness'), 't', makeEnv(newShell(rootShell), nil))
  if not fn then error(err, 0) end
  return kernel.spawn(fn, name)
end

function kernel.boot()
  return kernel.spawn(function()
    if fs.exists('/startup.lua') then rootShell.run('/startup.lua') end
    if fs.isDir('/startup') then
      for _, name in ipairs(fs.list('/startup')) do rootShell.run('/' .. fs.combine('startup', name)) end
    end
  end, 'shell')
end

function kernel.eval(code)
  local fn, err = nativeLoad(code, '=eval', 't', _G)
  if not fn then error(err, 0) end
  return fn()
end

return kernel
