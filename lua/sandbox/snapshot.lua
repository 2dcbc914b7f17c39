local _VERSION = '0.1.0'

-- libsandbox's module sandbox/snapshot: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Snapshots ===================================================================
-- Owns: snapshot_list (SPEC §15): every file a snapshot takes, outside /rom, drives and
-- /.settings. Needs: constants, handlers, files. Registers snapshot_list.

local M, internal = ...
local errorValue = internal.errorValue
local freeSpaceFor = internal.freeSpaceFor
local jsonList = internal.jsonList
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf

M.SNAPSHOT_BATCH = 64    -- paths looked at between yields while listing for a snapshot
-- Bytes a listed file adds to the answer's JSON besides its path (keys, numbers, quotes).
M.SNAPSHOT_ENTRY_BYTES = 64

-- Whether a snapshot leaves `path` (an fs path, '' for the root) out: /rom and other
-- read-only paths, mounted drives (anything not on the computer's own disk), /.settings.
local function snapshotSkips(fsApi, path)
  if path == '' then return false end
  if M.isSettingsPath('/' .. path) then return true end
  if fsApi.getDrive then
    local ok, drive = pcall(fsApi.getDrive, path)
    if not ok or drive ~= 'hdd' then return true end
  end
  local ok, readOnly = pcall(fsApi.isReadOnly, path)
  return not ok or readOnly == true
end

-- {isDir, size, modified (ms)} of `path`, or nil when it vanished meanwhile.
local function snapshotAttributes(fsApi, path)
  if fsApi.attributes then
    local ok, attrs = pcall(fsApi.attributes, path)
    if not ok or type(attrs) ~= 'table' then return nil end
    return attrs.isDir == true, attrs.size or 0, math.floor(attrs.modified or attrs.modification or 0)
  end
  if not fsApi.exists(path) then return nil end
  if fsApi.isDir(path) then return true, 0, 0 end
  return false, fsApi.getSize(path), 0
end

--[[ snapshot_list {} -> {files: [{path, size, modified}], total, free?}: every file a snapshot
holds, and the free bytes of the computer's disk.
The walk looks at M.SNAPSHOT_BATCH paths, then waits for a 0 s timer (the daemon's loop may not
block, and CraftOS kills code that runs ~7 s without yielding), so a disk of hundreds of files
never stalls other requests. The answer is one frame: a listing that would not fit is refused
with too_large, plainly. ]]
local function handleSnapshotList(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, attempt = session.fs, session.current
  local files, total, bytes = {}, 0, 256
  local pending = { '' }
  local function step()
    if session.current ~= attempt or (attempt and attempt.done) then return end -- connection gone
    for _ = 1, M.SNAPSHOT_BATCH do
      local path = table.remove(pending)
      if path == nil then break end
      if not snapshotSkips(fsApi, path) then
        local isDir, size, modified = snapshotAttributes(fsApi, path)
        if isDir then
          local ok, names = pcall(fsApi.list, path)
          if ok then
            for i = #names, 1, -1 do pending[#pending + 1] = fsApi.combine(path, names[i]) end
          end
        elseif isDir == false then
          files[#files + 1] = { path = '/' .. path, size = size, modified = modified }
          total = total + size
          bytes = bytes + #path + M.SNAPSHOT_ENTRY_BYTES
        end
      end
    end
    if #pending > 0 then return session.loop.setTimeout(step, 0) end
    if bytes > M.MAX_SEND then
      return req.respond(false, nil, errorValue('too_large', ('this computer has %d files: their list '
        .. 'does not fit in one %d-byte frame, so no snapshot can be taken (delete some files)'):format(#files, M.MAX_SEND)))
    end
    -- free: what a restore may use (the gateway checks a whole restore fits before it starts).
    local free = freeSpaceFor(fsApi, 'x')
    req.respond(true, { files = jsonList(files), total = total, free = free })
  end
  step()
end
-- snapshot_list: {files: [{path, size, modified}], total}, all but /rom, drives, /.settings (§15)
registerRequest('snapshot_list', 'fs.read', handleSnapshotList)
