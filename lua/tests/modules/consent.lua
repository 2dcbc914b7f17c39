local _VERSION = '0.1.0'

-- Unit tests for sandbox/consent.lua alone: sandbox.allow read and changed.
local kit = ...
local test, eq, truthy, raises = kit.test, kit.eq, kit.truthy, kit.raises

test('parseCapabilities keeps known names in canonical order', function()
  local M = kit.modules('core', 'consent')
  eq(M.parseCapabilities('fs.read, exec,bogus  screen'), { 'exec', 'fs.read', 'screen' }, 'parsed')
  eq(M.parseCapabilities(nil), {}, 'unset allows nothing')
  eq(M.parseCapabilities(42), {}, 'a hand-edited number allows nothing')
end)

test('changeCapabilities allows all but turtle and denies by name', function()
  local M = kit.modules('core', 'consent')
  local value, list = M.changeCapabilities('', true, { 'all' })
  eq(list, { 'exec', 'eval', 'fs.read', 'fs.write', 'screen', 'input', 'peripheral' }, 'all')
  eq(value, table.concat(list, ','), 'the setting\'s value')
  value = M.changeCapabilities(value, true, { 'turtle' })
  truthy(value:find('turtle'), 'turtle only by name')
  value = M.changeCapabilities(value, false, { 'exec', 'turtle' })
  eq(value, 'eval,fs.read,fs.write,screen,input,peripheral', 'denied')
  local none, message = M.changeCapabilities(value, true, { 'root' })
  eq(none, nil, 'an unknown name changes nothing')
  truthy(message:find('unknown capability root'), message)
  raises(function() M.changeCapabilities('', 'yes', {}) end, 'bad argument #2', 'allow must be a boolean')
end)

test('whole-computer and turtle grants are recognised', function()
  local M = kit.modules('core', 'consent')
  eq(M.grantsWholeComputer({ 'fs.read', 'input' }), true, 'input')
  eq(M.grantsWholeComputer({ 'all' }), true, 'all')
  eq(M.grantsWholeComputer({ 'fs.read', 'screen' }), false, 'reading is not the whole computer')
  eq(M.grantsTurtle({ 'all' }), false, 'all is not turtle')
  eq(M.grantsTurtle({ 'turtle' }), true, 'turtle')
end)

return kit.suite()
