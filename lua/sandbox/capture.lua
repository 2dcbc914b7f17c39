local _VERSION = '0.1.0'

-- libsandbox's module sandbox/capture: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Output capture and the terminal =============================================
-- Owns: what a program run by exec or eval prints (per stream, bounded), the redirect target
-- that records it while drawing where the player looks, the swapped write/printError.
-- Needs: constants. Exports: M.newCapture, M.TERM_METHODS.

local M, internal = ...

--[[ What a program run by exec or eval prints is recorded per stream, up to maxBytes each
(the rest is dropped and the stream flagged truncated), and queued for partial responses.
It is caught at two depths while the program runs (only then):
  - _G.write and _G.printError are swapped for capturedWrite / capturedPrintError, so print
    and write land in stdout with their own newlines and printError in stderr;
  - the program's terminal is a redirect that draws on the daemon's terminal (the player sees
    it) and records term.write / term.blit calls made outside write, a row change or a scroll
    standing for a newline.
`depth` > 0 while inside the swapped functions, so their own term calls are not recorded twice. ]]
local Capture = {}
Capture.__index = Capture

function M.newCapture(maxBytes, mergeStderr)
  local function stream() return { pieces = {}, bytes = 0, truncated = false } end
  return setmetatable({
    max = maxBytes or M.MAX_OUTPUT_BYTES, merge = mergeStderr, depth = 0, row = nil,
    stdout = stream(), stderr = stream(), pending = {},
  }, Capture)
end

function Capture:record(name, text)
  if text == '' then return end
  if self.merge then name = 'stdout' end
  local stream = self[name]
  local room = self.max - stream.bytes
  if room <= 0 then stream.truncated = true; return end
  if #text > room then
    text = text:sub(1, room)
    stream.truncated = true
  end
  stream.pieces[#stream.pieces + 1] = text
  stream.bytes = stream.bytes + #text
  local last = self.pending[#self.pending]
  if last and last.name == name then
    last.pieces[#last.pieces + 1] = text
    last.bytes = last.bytes + #text
  else
    self.pending[#self.pending + 1] = { name = name, pieces = { text }, bytes = #text }
  end
end

function Capture:text(name)
  return table.concat(self[name].pieces)
end

-- The oldest pending run of one stream, at most `limit` bytes of it: name, data (or nil).
function Capture:takePending(limit)
  local run = self.pending[1]
  if not run then return nil end
  local data = table.concat(run.pieces)
  if #data > limit then
    run.pieces, run.bytes = { data:sub(limit + 1) }, #data - limit
    data = data:sub(1, limit)
  else
    table.remove(self.pending, 1)
  end
  return run.name, data
end

--[[ The methods of CraftOS's terminal (term.native() once term.lua has moved
nativePaletteColour and screenshot onto `term`): CC:Tweaked's TermMethods, then CraftOS-PC's
graphics-mode extras. A terminal built over another takes its parent's methods by these names,
by indexing: a parent that is a wrapper (`setmetatable({write = ...}, {__index = ...})`, as
screen recorders and multiplexers make them) has most of its methods behind `__index`, where
`pairs` never looks. A name the parent lacks stays absent, so term.redirect treats the new
terminal as it would the parent: CraftOS-PC lends the native graphics methods, and a missing
standard method becomes its "Redirect object is missing method X." stub. ]]
M.TERM_METHODS = {
  'write', 'scroll', 'setCursorPos', 'setCursorBlink', 'getCursorPos', 'getCursorBlink',
  'getSize', 'clear', 'clearLine', 'setTextColour', 'setTextColor', 'setBackgroundColour',
  'setBackgroundColor', 'isColour', 'isColor', 'getTextColour', 'getTextColor',
  'getBackgroundColour', 'getBackgroundColor', 'blit', 'setPaletteColour', 'setPaletteColor',
  'getPaletteColour', 'getPaletteColor',
  'setGraphicsMode', 'getGraphicsMode', 'setPixel', 'getPixel', 'drawPixels', 'getPixels',
  'showMouse', 'relativeMouse', 'setFrozen', 'getFrozen',
  -- A window's own, passed on when the parent is one (a program may ask its terminal for them).
  'getLine', 'setVisible', 'isVisible', 'redraw', 'restoreCursor', 'getPosition', 'reposition',
}

-- A redirect target drawing on `parent` (each of its M.TERM_METHODS) that records what is written.
function Capture:terminal(parent)
  local cap = self
  local t = {}
  for _, name in ipairs(M.TERM_METHODS) do
    if type(parent[name]) == 'function' then t[name] = function(...) return parent[name](...) end end
  end
  if parent.getCursorPos then
    local ok, _, y = pcall(parent.getCursorPos)
    if ok then cap.row = y end
  end
  function t.write(text)
    if cap.depth == 0 then cap:record('stdout', tostring(text)) end
    return parent.write(text)
  end
  function t.blit(text, fg, bg)
    if cap.depth == 0 then cap:record('stdout', tostring(text)) end
    return parent.blit(text, fg, bg)
  end
  function t.setCursorPos(x, y)
    if cap.depth == 0 and cap.row ~= nil and y ~= cap.row then cap:record('stdout', '\n') end
    cap.row = y
    return parent.setCursorPos(x, y)
  end
  function t.scroll(n)
    if cap.depth == 0 and type(n) == 'number' and n >= 1 then cap:record('stdout', ('\n'):rep(n)) end
    return parent.scroll(n)
  end
  return t
end

-- Set by the jobs module while it resumes a job: `capture`, the job's capture; `write` and
-- `printError`, what _G held when a job last started running.
local swapped = { capture = nil, write = nil, printError = nil }

local function capturedWrite(text)
  local cap = swapped.capture
  if cap and cap.depth == 0 and (type(text) == 'string' or type(text) == 'number') then
    cap:record('stdout', tostring(text))
    cap.depth = cap.depth + 1
    local lines = swapped.write and swapped.write(text) or 0
    cap.depth = cap.depth - 1
    return lines
  end
  if swapped.write then return swapped.write(text) end
  return 0
end

local function capturedPrintError(...)
  local cap = swapped.capture
  if cap and cap.depth ~= 0 then cap = nil end
  if cap then
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    cap:record('stderr', table.concat(parts, '\t') .. '\n')
    cap.depth = cap.depth + 1
  end
  if swapped.printError then swapped.printError(...) end
  if cap then cap.depth = cap.depth - 1 end
end

internal.swapped = swapped
internal.capturedWrite = capturedWrite
internal.capturedPrintError = capturedPrintError
