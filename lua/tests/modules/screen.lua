local _VERSION = '0.1.0'

-- Unit tests for sandbox/screen.lua alone: compact rows and the recorder of a terminal.
local kit = ...
local test, eq = kit.test, kit.eq

-- A 5x2 terminal that draws nothing, white on black.
local function fakeTerm()
  local x, y = 1, 1
  local t = {}
  function t.getSize() return 5, 2 end
  function t.getCursorPos() return x, y end
  function t.setCursorPos(nx, ny) x, y = nx, ny end
  function t.write(text) x = x + #tostring(text) end
  function t.getTextColour() return 1 end
  function t.getBackgroundColour() return 32768 end
  return t
end

test('compactRow cuts each final run to one character', function()
  local M = kit.modules('core', 'capture', 'screen')
  eq(M.compactRow('hi   ', '00000', 'fffff'), { line = 'hi ', text = '0', background = 'f' }, 'row')
  eq(M.compactRow('abc', '012', 'fff'), { line = 'abc', text = '012', background = 'f' }, 'no run')
end)

test('a recorder keeps what was written, in its colours', function()
  local M = kit.modules('core', 'capture', 'screen')
  local native = fakeTerm()
  local rec = M.newRecorder(native)
  rec.wrapped.setCursorPos(2, 2)
  rec.wrapped.write('ok')
  eq({ rec.getLine(2) }, { ' ok  ', '00000', 'fffff' }, 'row 2')
  eq({ rec.getLine(1) }, { '     ', '00000', 'fffff' }, 'row 1 blank')
  eq({ native.getCursorPos() }, { 4, 2 }, 'written through to the terminal')
end)

return kit.suite()
