local _VERSION = '0.1.0'

-- Unit tests for sandbox/snapshot.lua (with the modules it needs) on a fake fs.
local kit = ...
local test, eq = kit.test, kit.eq

test('snapshot_list lists every file but /rom and /.settings, in batches', function()
  local M = kit.modules('core', 'encoding', 'handlers', 'files', 'snapshot', 'requests')
  M.SNAPSHOT_BATCH = 2 -- so that listing takes several timer turns
  local fsApi = kit.fakes.fs()
  fsApi.put('a.txt', 'aaa')
  fsApi.put('dir/b.txt', 'b')
  fsApi.put('.settings', 'secret')
  fsApi.put('rom/programs/x.lua', 'x')
  local timers = {}
  local session = { fs = fsApi, loop = { setTimeout = function(fn) timers[#timers + 1] = fn end } }
  local answer
  local req = { payload = {} }
  function req.respond(ok, result, err) answer = { ok = ok, result = result, err = err } end
  M.requestHandlers.snapshot_list(req, { session = session })
  local turns = 0
  while not answer and #timers > 0 do
    turns = turns + 1
    table.remove(timers, 1)()
  end
  eq(answer.ok, true, 'answered')
  local paths = {}
  for i, file in ipairs(answer.result.files) do paths[i] = file.path end
  table.sort(paths)
  eq(paths, { '/a.txt', '/dir/b.txt' }, 'the files a snapshot takes')
  eq(answer.result.total, 4, 'their bytes')
  eq(turns > 0, true, 'listed over several turns')
end)

return kit.suite()
