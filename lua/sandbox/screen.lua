local _VERSION = '0.1.0'

-- libsandbox's module sandbox/screen: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The screen ==================================================================
-- Owns: making the computer's screen readable however the daemon started (a recorder over the
-- native terminal, installed once), and screen_watch's streams of changed rows (SPEC §14).
-- Needs: constants, capture (M.TERM_METHODS). Exports: M.installRecorder, M.newRecorder,
-- M.compactRow, M.RECORDER_GLOBAL, M.MAX_WATCHES, M.SCREEN_WATCH_FPS.

local M, internal = ...

--[[ The native terminal cannot be read back. The recorder wraps the native terminal's drawing
methods in place: each one (taken from the native table by name, M.RECORDED_METHODS) draws
exactly as before and then mirrors what it drew into a buffer of lines and blit colours, and
tells the watches which rows changed.

Why in place, and not a window redirect: everything that reaches the screen goes through the
native table's methods, looked up at each call — term.lua's own redirect target, the windows
multishell and the installer's startup made over it before the daemon started, a program that
calls term.native() itself — so all of it is recorded, and every redirect keeps working as
before. A window over term.native() would repaint the screen when made (the player would see it
cleared), would not see what others draw on the native terminal directly and would later paint
its stale copy over it. The player sees exactly what they saw: every call is passed on first.
What was drawn before the recorder was installed is not known (blank) until it is redrawn,
unless the terminal the daemon started in is a readable window of the whole screen, which seeds
it.

Installed once per computer: _G[M.RECORDER_GLOBAL] holds the recorder, and a second daemon or a
reloaded library reuses it rather than wrapping the wrappers. ]]
M.RECORDER_GLOBAL = 'traposSandboxRecorder'
M.RECORDED_METHODS = {
  'write', 'blit', 'clear', 'clearLine', 'scroll', 'setCursorPos', 'setCursorBlink',
  'setPaletteColour', 'setPaletteColor',
}
M.MAX_WATCHES = 4                 -- screen_watch requests at once (overloaded past that)
M.SCREEN_WATCH_FPS = 10           -- default maxFps; at most 20

local BLIT_DIGITS = '0123456789abcdef'

-- A colour (a power of two, colours.white = 1 ... colours.black = 32768) as its blit digit.
local function blitDigit(colour)
  local bit = 0
  colour = type(colour) == 'number' and colour or 1
  while colour >= 2 and bit < 15 do
    colour = colour / 2
    bit = bit + 1
  end
  return BLIT_DIGITS:sub(bit + 1, bit + 1)
end

-- `s` written into `line` (`width` cells) from column `x`, clipped to the line.
local function splice(line, x, s, width)
  local first, last = x, x + #s - 1
  if first < 1 then first = 1 end
  if last > width then last = width end
  if first > last then return line end
  return line:sub(1, first - 1) .. s:sub(first - x + 1, last - x + 1) .. line:sub(last + 1)
end

--[[ A row as screen_watch sends it: each of line, text and background with its final run of one
character cut to a single one (a string shorter than the width continues with its last
character), so a short line in one colour costs its text and two characters of colour, and a
one-row change of a 51x19 screen fits in 300 bytes on the wire. ]]
function M.compactRow(line, text, background)
  local function cut(s)
    local last = s:sub(-1)
    local stop = #s
    while stop > 1 and s:sub(stop - 1, stop - 1) == last do stop = stop - 1 end
    return s:sub(1, stop)
  end
  return { line = cut(line), text = cut(text), background = cut(background) }
end

--[[ newRecorder(native) -> recorder: the buffer and the wrapped methods (recorder.wrapped), not
yet installed. recorder: getSize(), getLine(y) -> line, text, background, getCursorPos(),
getCursorBlink(), palette() -> 16 "#rrggbb" (blit digit order), sync() (picks up a resize),
watch(w) -> unwatch(): w.rows[y] = true for each changed row, w.paletteChanged = true, and
w:poke() on every change (cursor moves and blink included). ]]
function M.newRecorder(native)
  local parent = {}
  for _, name in ipairs(M.TERM_METHODS) do
    if type(native[name]) == 'function' then parent[name] = native[name] end
  end
  local rec = { native = native, parent = parent, watchers = {}, wrapped = {} }
  local width, height = parent.getSize()
  local lines, texts, backs = {}, {}, {}
  local cursorX, cursorY, blink = nil, nil, nil

  local function colours()
    local fg = parent.getTextColour or parent.getTextColor
    local bg = parent.getBackgroundColour or parent.getBackgroundColor
    return blitDigit(fg and fg() or 1), blitDigit(bg and bg() or 32768)
  end
  local function notify(row, palette)
    for watcher in pairs(rec.watchers) do
      if row then watcher.rows[row] = true end
      if palette then watcher.paletteChanged = true end
      watcher:poke()
    end
  end
  local function fill(row, fg, bg)
    local changed = lines[row] ~= (' '):rep(width) or texts[row] ~= fg:rep(width) or backs[row] ~= bg:rep(width)
    lines[row], texts[row], backs[row] = (' '):rep(width), fg:rep(width), bg:rep(width)
    if changed then notify(row) end
  end
  local function put(x, y, s, f, b)
    if y < 1 or y > height or #s == 0 then return end
    local line, text, back = splice(lines[y], x, s, width), splice(texts[y], x, f, width), splice(backs[y], x, b, width)
    if line ~= lines[y] or text ~= texts[y] or back ~= backs[y] then
      lines[y], texts[y], backs[y] = line, text, back
      notify(y)
    end
  end
  local function blankAll()
    local fg, bg = colours()
    for row = 1, height do lines[row], texts[row], backs[row] = (' '):rep(width), fg:rep(width), bg:rep(width) end
  end
  blankAll()

  local w = rec.wrapped
  function w.write(text)
    local x, y = parent.getCursorPos()
    local r = table.pack(parent.write(text))
    local s = tostring(text)
    local fg, bg = colours()
    put(x, y, s, fg:rep(#s), bg:rep(#s))
    return table.unpack(r, 1, r.n)
  end
  function w.blit(text, fg, bg)
    local x, y = parent.getCursorPos()
    local r = table.pack(parent.blit(text, fg, bg))
    if type(text) == 'string' and type(fg) == 'string' and type(bg) == 'string' then
      put(x, y, text, fg:lower(), bg:lower())
    end
    return table.unpack(r, 1, r.n)
  end
  function w.clear()
    local r = table.pack(parent.clear())
    local fg, bg = colours()
    for row = 1, height do fill(row, fg, bg) end
    return table.unpack(r, 1, r.n)
  end
  function w.clearLine()
    local r = table.pack(parent.clearLine())
    local _, y = parent.getCursorPos()
    if y >= 1 and y <= height then
      local fg, bg = colours()
      fill(y, fg, bg)
    end
    return table.unpack(r, 1, r.n)
  end
  function w.scroll(n)
    local r = table.pack(parent.scroll(n))
    n = type(n) == 'number' and math.floor(n) or 0
    if n ~= 0 then
      local fg, bg = colours()
      local blank, blankFg, blankBg = (' '):rep(width), fg:rep(width), bg:rep(width)
      local newLines, newTexts, newBacks = {}, {}, {}
      for row = 1, height do
        local from = row + n
        if from >= 1 and from <= height then
          newLines[row], newTexts[row], newBacks[row] = lines[from], texts[from], backs[from]
        else
          newLines[row], newTexts[row], newBacks[row] = blank, blankFg, blankBg
        end
      end
      for row = 1, height do
        local changed = newLines[row] ~= lines[row] or newTexts[row] ~= texts[row] or newBacks[row] ~= backs[row]
        lines[row], texts[row], backs[row] = newLines[row], newTexts[row], newBacks[row]
        if changed then notify(row) end
      end
    end
    return table.unpack(r, 1, r.n)
  end
  -- A cursor set where it already is (window.restoreCursor after every event) is no change:
  -- an idle screen must not wake the watches.
  function w.setCursorPos(x, y)
    local r = table.pack(parent.setCursorPos(x, y))
    if x ~= cursorX or y ~= cursorY then
      cursorX, cursorY = x, y
      notify()
    end
    return table.unpack(r, 1, r.n)
  end
  function w.setCursorBlink(on)
    local r = table.pack(parent.setCursorBlink(on))
    if on ~= blink then
      blink = on
      notify()
    end
    return table.unpack(r, 1, r.n)
  end
  local function setPalette(name)
    return function(...)
      local r = table.pack(parent[name](...))
      notify(nil, true)
      return table.unpack(r, 1, r.n)
    end
  end
  w.setPaletteColour, w.setPaletteColor = setPalette('setPaletteColour'), setPalette('setPaletteColor')
  for name in pairs(w) do
    if not parent[name] then w[name] = nil end
  end

  -- A terminal resized since (CraftOS-PC's window, term_resize): the buffer follows, all rows
  -- changed.
  function rec.sync()
    local newWidth, newHeight = parent.getSize()
    if newWidth == width and newHeight == height then return false end
    local fg, bg = colours()
    for row = 1, newHeight do
      local line, text, back = lines[row] or '', texts[row] or '', backs[row] or ''
      local pad = newWidth - #line
      if pad > 0 then
        line, text, back = line .. (' '):rep(pad), text .. fg:rep(pad), back .. bg:rep(pad)
      end
      lines[row], texts[row], backs[row] = line:sub(1, newWidth), text:sub(1, newWidth), back:sub(1, newWidth)
    end
    for row = newHeight + 1, height do lines[row], texts[row], backs[row] = nil, nil, nil end
    width, height = newWidth, newHeight
    for row = 1, height do notify(row) end
    return true
  end
  function rec.getSize() return width, height end
  function rec.getLine(y) return lines[y], texts[y], backs[y] end
  function rec.getCursorPos() return parent.getCursorPos() end
  function rec.getCursorBlink()
    if parent.getCursorBlink then return parent.getCursorBlink() == true end
    return blink == true
  end
  function rec.palette()
    local list = {}
    local get = parent.getPaletteColour or parent.getPaletteColor
    for i = 0, 15 do
      local hex = '#000000'
      if get then
        local ok, r, g, b = pcall(get, 2 ^ i)
        if ok and type(r) == 'number' then
          hex = ('#%02x%02x%02x'):format(math.floor(r * 255 + 0.5), math.floor(g * 255 + 0.5), math.floor(b * 255 + 0.5))
        end
      end
      list[i + 1] = hex
    end
    return list
  end
  -- Rows drawn before the recorder existed, from a readable terminal of the whole screen.
  function rec.seed(readable)
    if type(readable) ~= 'table' or type(readable.getLine) ~= 'function' or type(readable.getSize) ~= 'function' then return end
    local ok, w2, h2 = pcall(readable.getSize)
    if not ok or w2 ~= width or h2 ~= height then return end
    for row = 1, height do
      local okLine, line, text, back = pcall(readable.getLine, row)
      if okLine and type(line) == 'string' and #line == width and type(text) == 'string' and #text == width
        and type(back) == 'string' and #back == width then
        lines[row], texts[row], backs[row] = line, text, back
      end
    end
  end
  function rec.watch(watcher)
    rec.watchers[watcher] = true
    return function() rec.watchers[watcher] = nil end
  end
  return rec
end

-- The recorder of `termApi`'s native terminal, installed once per computer; nil when there is
-- no native terminal to record.
function M.installRecorder(termApi)
  if type(termApi) ~= 'table' or type(termApi.native) ~= 'function' then return nil end
  local ok, native = pcall(termApi.native)
  if not ok or type(native) ~= 'table' or type(native.getSize) ~= 'function' or type(native.getCursorPos) ~= 'function' then
    return nil
  end
  local rec = rawget(_G, M.RECORDER_GLOBAL)
  if type(rec) == 'table' and rec.native == native and type(rec.getLine) == 'function' then return rec end
  rec = M.newRecorder(native)
  if termApi.current then
    local okCurrent, current = pcall(termApi.current)
    if okCurrent and current ~= native then rec.seed(current) end
  end
  for name, fn in pairs(rec.wrapped) do native[name] = fn end
  rawset(_G, M.RECORDER_GLOBAL, rec)
  return rec
end

--[[ A screen_watch: the first partial carries the whole screen (every row, width, height, the
cursor, cursorBlink and the palette); each later one only what changed since the one before —
the changed rows (M.compactRow), cursorX and cursorY always, width, height, cursorBlink and
palette when they changed. A draw arms one timer (none while nothing changes), so partials are
at least 1000 / maxFps ms apart and coalesce every draw in between. It ends when cancelled or
when its connection ends. ]]
local Watch = {}
Watch.__index = Watch

function Watch:poke()
  if self.done or self.clearTimer then return end
  local session = self.session
  local wait = self.lastFrame and (self.lastFrame + self.interval - session.clock()) or 0
  if wait < 0 then wait = 0 end
  self.clearTimer = session.loop.setTimeout(function()
    self.clearTimer = nil
    if not self.done then self:frame(false) end
  end, wait / 1000)
end

function Watch:frame(first)
  local rec, sent = self.recorder, self.sent
  rec.sync()
  local width, height = rec.getSize()
  local cursorX, cursorY = rec.getCursorPos()
  local blink = rec.getCursorBlink()
  local payload = { type = 'screen', cursorX = cursorX, cursorY = cursorY }
  local changed = first or cursorX ~= sent.cursorX or cursorY ~= sent.cursorY
  if first or width ~= sent.width or height ~= sent.height then
    payload.width, payload.height, changed = width, height, true
  end
  if first or blink ~= sent.cursorBlink then payload.cursorBlink, changed = blink, true end
  if first then
    for y = 1, height do self.rows[y] = true end
    self.paletteChanged = true
  end
  local rows = {}
  for y in pairs(self.rows) do
    if y >= 1 and y <= height then
      rows[tostring(y)] = M.compactRow(rec.getLine(y))
      changed = true
    end
  end
  payload.rows = rows
  if self.paletteChanged then payload.palette, changed = rec.palette(), true end
  self.rows, self.paletteChanged = {}, false
  if not changed then return end
  self.req.partial(payload)
  self.lastFrame = self.session.clock()
  sent.width, sent.height, sent.cursorX, sent.cursorY, sent.cursorBlink = width, height, cursorX, cursorY, blink
end

-- Ends the watch: `cancel` answers `cancelled`; the end of its connection answers nothing
-- anyone can receive. Returns whether it was running.
function Watch:stop(reason)
  if self.done then return false end
  self.done = true
  self.unwatch()
  if self.clearTimer then self.clearTimer(); self.clearTimer = nil end
  local session = self.session
  session.watches[self.req.messageId] = nil
  session.watchCount = session.watchCount - 1
  if reason == 'cancel' then
    self.req.respond(false, nil, M.errorValue('cancelled', 'cancelled by the gateway'))
  elseif reason == 'stopped' then
    self.req.respond(false, nil, session:stopReason() or M.errorValue('stopped', 'stopped on the computer'))
  else
    self.req.respond(false, nil, M.errorValue('not_connected', 'the connection ended'))
  end
  return true
end

-- Starts a screen_watch of `recorder` for `req` on `session`, at most maxFps frames a second.
local function startWatch(session, req, recorder, maxFps)
  if session.watches[req.messageId] then
    return req.respond(false, nil, M.errorValue('bad_request', 'a request with this messageId is running'))
  end
  if session.watchCount >= M.MAX_WATCHES then
    return req.respond(false, nil, M.errorValue('overloaded', ('%d screen watches are running already'):format(session.watchCount)))
  end
  local watch = setmetatable({
    session = session, req = req, recorder = recorder, attempt = session.current,
    interval = 1000 / maxFps, rows = {}, paletteChanged = false, sent = {}, done = false,
  }, Watch)
  session.watches[req.messageId] = watch
  session.watchCount = session.watchCount + 1
  watch.unwatch = recorder.watch(watch)
  watch:frame(true)
end

-- Stops the watches started on `attempt` (all watches when nil), for `reason` (default
-- 'disconnect').
local function stopWatches(session, attempt, reason)
  local list = {}
  for _, watch in pairs(session.watches) do
    if attempt == nil or watch.attempt == attempt then list[#list + 1] = watch end
  end
  for _, watch in ipairs(list) do watch:stop(reason or 'disconnect') end
end

internal.startWatch = startWatch
internal.stopWatches = stopWatches
