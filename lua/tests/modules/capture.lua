local _VERSION = '0.1.0'

-- Unit tests for sandbox/capture.lua alone: what a program prints, per stream and bounded.
local kit = ...
local test, eq = kit.test, kit.eq

test('a capture keeps each stream up to its bound and flags the rest', function()
  local M = kit.modules('core', 'capture')
  local cap = M.newCapture(5)
  cap:record('stdout', 'abc')
  cap:record('stderr', 'oops')
  cap:record('stdout', 'defg')
  eq(cap:text('stdout'), 'abcde', 'stdout cut at 5 bytes')
  eq(cap.stdout.truncated, true, 'and flagged')
  eq(cap:text('stderr'), 'oops', 'stderr has its own bound')
  eq(cap.stderr.truncated, false, 'not flagged')
end)

test('pending output comes out in runs of one stream, at most limit bytes each', function()
  local M = kit.modules('core', 'capture')
  local cap = M.newCapture(100)
  cap:record('stdout', 'ab')
  cap:record('stdout', 'cd')
  cap:record('stderr', 'E')
  eq({ cap:takePending(3) }, { 'stdout', 'abc' }, 'first part of the stdout run')
  eq({ cap:takePending(3) }, { 'stdout', 'd' }, 'its rest')
  eq({ cap:takePending(3) }, { 'stderr', 'E' }, 'then stderr')
  eq(cap:takePending(3), nil, 'nothing left')
end)

test('a merged capture records stderr as stdout', function()
  local M = kit.modules('core', 'capture')
  local cap = M.newCapture(100, true)
  cap:record('stdout', 'a')
  cap:record('stderr', 'b')
  eq(cap:text('stdout'), 'ab', 'one stream')
end)

test('capturedWrite records into the running job\'s capture and writes through', function()
  local M, internal = kit.modules('core', 'capture')
  local written = {}
  local cap = M.newCapture(100)
  internal.swapped.write = function(text) written[#written + 1] = text; return 1 end
  internal.swapped.capture = cap
  eq(internal.capturedWrite('hi'), 1, 'lines from the real write')
  internal.swapped.capture = nil
  internal.capturedWrite('not recorded')
  eq(cap:text('stdout'), 'hi', 'recorded only while the job runs')
  eq(written, { 'hi', 'not recorded' }, 'always written')
end)

return kit.suite()
