local _VERSION = '0.1.0'

-- Unit tests for sandbox/files.lua alone (with core, encoding and handlers) on a fake fs.
local kit = ...
local test, eq, truthy = kit.test, kit.eq, kit.truthy

-- The files module and a request runner: call(type, payload) -> ok, payload, error.
local function setUp()
  local M = kit.modules('core', 'encoding', 'handlers', 'files', 'requests')
  local fsApi = kit.fakes.fs()
  local now = 0
  local ctx = { session = { fs = fsApi, clock = function() return now end } }
  local function call(msgType, payload)
    local answer
    local req = { type = msgType, payload = M.coercePayload(payload) }
    function req.respond(ok, result, err) answer = { ok, result, err } end
    M.requestHandlers[msgType](req, ctx)
    return answer[1], answer[2], answer[3]
  end
  local function advance(ms) now = now + ms end
  return M, fsApi, call, advance
end

test('list_files lists a folder; a missing one is fs_error', function()
  local _, fsApi, call = setUp()
  fsApi.put('docs/a.txt', 'hello')
  fsApi.put('docs/sub/b.txt', 'x')
  local ok, answer = call('list_files', { path = '/docs' })
  eq(ok, true, 'ok')
  eq(answer.path, '/docs', 'path')
  local byName = {}
  for _, entry in ipairs(answer.entries) do byName[entry.name] = entry end
  eq(byName['a.txt'].type, 'file', 'a file')
  eq(byName['a.txt'].size, 5, 'its size')
  eq(byName.sub.type, 'dir', 'a folder')
  local failed, _, err = call('list_files', { path = '/nope' })
  eq({ failed, err.code, err.message }, { false, 'fs_error', '/nope: No such file' }, 'missing')
end)

test('read_file answers base64 of a range', function()
  local M, fsApi, call = setUp()
  fsApi.put('data.bin', 'abcdefgh')
  local ok, answer = call('read_file', { path = 'data.bin', offset = 2, length = 3 })
  eq(ok, true, 'ok')
  eq(M.base64Decode(answer.content), 'cde', 'the range')
  eq({ answer.sizeBytes, answer.offset, answer.bytesRead }, { 8, 2, 3 }, 'sizes')
end)

test('write_file then delete_file', function()
  local M, fsApi, call = setUp()
  local ok = call('write_file', { path = '/notes/today.txt', content = M.base64Encode('dig') })
  eq(ok, true, 'written')
  eq(fsApi.files['notes/today.txt'], 'dig', 'content')
  local deleted, answer = call('delete_file', { path = '/notes/today.txt' })
  eq({ deleted, answer.deleted }, { true, true }, 'deleted')
  eq(fsApi.files['notes/today.txt'], nil, 'gone')
end)

test('/.settings is refused in any spelling, and /rom is read-only', function()
  local _, fsApi, call = setUp()
  fsApi.put('.settings', '{ ["sandbox.password"] = "x" }')
  for _, path in ipairs({ '/.settings', '//.SETTINGS', 'x/../.settings' }) do
    local ok, _, err = call('read_file', { path = path })
    eq({ ok, err.code }, { false, 'forbidden' }, path)
  end
  fsApi.put('rom/startup.lua', '')
  local ok, _, err = call('delete_file', { path = '/rom/startup.lua' })
  eq({ ok, err.code }, { false, 'fs_error' }, 'rom')
  truthy(err.message:find('Access denied', 1, true), err.message)
end)

test('move_file and make_folder change one thing in one step', function()
  local _, fsApi, call = setUp()
  fsApi.put('a/b.txt', 'b')
  local ok, answer = call('move_file', { from = '/a', to = '/c/d' })
  eq({ ok, answer.from, answer.to }, { true, '/a', '/c/d' }, 'moved')
  eq(fsApi.files['c/d/b.txt'], 'b', 'with what was in it')
  local inside, _, err = call('move_file', { from = '/c', to = '/c/e' })
  eq({ inside, err.code }, { false, 'bad_request' }, 'not inside itself')
  local made, folder = call('make_folder', { path = '/c/d' })
  eq({ made, folder.existed }, { true, true }, 'an existing folder is left')
end)


test('a write abandoned between two parts leaves nothing once it is stale', function()
  local M, fsApi, call, advance = setUp()
  local function part(id, text, offset, final)
    return call('write_file', { path = '/big.txt', content = M.base64Encode(text),
      part = { offset = offset, final = final, size = 8, writeId = id } })
  end
  eq(part('a1', 'half', 0, false), true, 'the first part of a write the gateway then gives up')
  local abandoned = '.big.txt.a1' .. M.TEMP_SUFFIX
  truthy(fsApi.files[abandoned], 'its temporary file')
  -- Another write soon after: the first may still be under way, so its file stays.
  eq(part('b2', 'other', 0, false), true, 'a second write starts')
  truthy(fsApi.files[abandoned], 'kept while it may still be under way')
  advance(M.STALE_WRITE_MS)
  eq(part('c3', 'whole123', 0, true), true, 'a write past the bound')
  eq(fsApi.files[abandoned], nil, 'the abandoned one is gone')
  eq(fsApi.files['.big.txt.b2' .. M.TEMP_SUFFIX], nil, 'and so is the second')
  eq(fsApi.files['big.txt'], 'whole123', 'the file is the last write')
end)

return kit.suite()
