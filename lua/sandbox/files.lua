local _VERSION = '0.1.0'

-- libsandbox's module sandbox/files: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Files =======================================================================
-- Owns: list_files, read_file, write_file (parts into a temporary file per write, the last one
-- moves it in; write_files: several whole files in one message), delete_file, move_file and
-- make_folder, each checked and done in one step.
-- Needs: constants, encodings, handlers. Exports: M.TEMP_SUFFIX; freeSpaceFor (snapshot).
-- Registers those seven request types.

local M, internal = ...
local badRequest = internal.badRequest
local encodingOk = internal.encodingOk
local errorText = internal.errorText
local filePath = internal.filePath
local fsError = internal.fsError
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local errorValue = internal.errorValue
local registerRequest = internal.registerRequest
local sessionOf = internal.sessionOf
local settingsForbidden = internal.settingsForbidden

local function fileEntry(fsApi, dir, name)
  local full = fsApi.combine(dir, name)
  if fsApi.attributes then
    local ok, attrs = pcall(fsApi.attributes, full)
    if ok and type(attrs) == 'table' then
      return { name = name, type = attrs.isDir and 'dir' or 'file', size = attrs.isDir and 0 or (attrs.size or 0),
        readOnly = attrs.isReadOnly == true }
    end
  end
  local isDir = fsApi.isDir(full)
  return { name = name, type = isDir and 'dir' or 'file', size = isDir and 0 or fsApi.getSize(full),
    readOnly = fsApi.isReadOnly(full) == true }
end

local function handleListFiles(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = filePath(req, fsApi, false)
  if not path then return end
  if not fsApi.exists(path) then return fsError(req, shown .. ': No such file') end
  if not fsApi.isDir(path) then return fsError(req, shown .. ': Not a directory') end
  local ok, names = pcall(fsApi.list, path)
  if not ok then return fsError(req, errorText(names)) end
  local entries = {}
  for i, name in ipairs(names) do entries[i] = fileEntry(fsApi, path, name) end
  req.respond(true, { path = shown, entries = jsonList(entries) })
end
-- list_files: {path, entries}
registerRequest('list_files', 'fs.read', handleListFiles)

-- Reads `length` bytes from `offset` of an open binary handle.
local function readRange(handle, offset, length)
  if offset > 0 then
    if handle.seek then
      handle.seek('set', offset)
    else
      local skipped = 0
      while skipped < offset do
        local chunk = handle.read(math.min(offset - skipped, M.MAX_CONTENT))
        if not chunk or chunk == '' then break end
        skipped = skipped + #chunk
      end
    end
  end
  local parts, got = {}, 0
  while got < length do
    local chunk = handle.read(length - got)
    if not chunk or chunk == '' then break end
    parts[#parts + 1] = chunk
    got = got + #chunk
  end
  return table.concat(parts)
end

local function handleReadFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, payload = session.fs, req.payload
  local encoding = encodingOk(req)
  if not encoding then return end
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  local offset, err = optionalNumber(payload, 'offset', 0, 0)
  if not offset then return badRequest(req, err) end
  local most = encoding == 'binary' and M.MAX_BINARY_CONTENT or M.MAX_CONTENT
  local length
  length, err = optionalNumber(payload, 'length', most, 0, most)
  if not length then return badRequest(req, err) end
  if not fsApi.exists(path) then return fsError(req, shown .. ': No such file') end
  if fsApi.isDir(path) then return fsError(req, shown .. ': Is a directory') end
  local handle, openErr = fsApi.open(path, 'rb')
  if not handle then return fsError(req, openErr or (shown .. ': cannot open')) end
  local ok, data = pcall(readRange, handle, offset, length)
  handle.close()
  if not ok then return fsError(req, errorText(data)) end
  local answer = { encoding = encoding, sizeBytes = fsApi.getSize(path), offset = offset, bytesRead = #data }
  if encoding == 'binary' then return req.respondBinary(answer, data) end
  answer.content = M.base64Encode(data)
  req.respond(true, answer)
end
-- read_file: base64 (64 KiB) or binary (120 KiB) a part
registerRequest('read_file', 'fs.read', handleReadFile)

-- The free space of the drive `path` is on (or will be on): asked of its nearest existing folder.
-- (`folder`: fs.getDir(path), when the caller has it already.)
local function freeSpaceFor(fsApi, path, folder)
  if not fsApi.getFreeSpace then return nil, 0 end
  local dir, missing = folder or fsApi.getDir(path), 0
  while dir ~= '' and dir ~= '..' and not fsApi.exists(dir) do
    missing = missing + 1
    dir = fsApi.getDir(dir)
  end
  if dir == '..' then dir = '' end
  local ok, free = pcall(fsApi.getFreeSpace, dir)
  if ok and type(free) == 'number' then return free, missing end
  return nil, missing -- "unlimited", or not answerable
end

-- Writes `data` to `path` ('wb' or 'ab'); the handle is closed exactly once. -> ok, message
local function writeBytes(fsApi, path, mode, data)
  local handle, openErr = fsApi.open(path, mode)
  if not handle then return false, openErr or ('/' .. path .. ': cannot open') end
  local ok, err = true, nil
  if data ~= '' then ok, err = pcall(handle.write, data) end
  local closed, closeErr = pcall(handle.close)
  if ok and not closed then ok, err = false, closeErr end
  if not ok then return false, errorText(err) end
  return true
end

-- Moves `temp` onto `path`, so `path` is replaced whole or not at all. -> ok, message
local function install(fsApi, temp, path)
  local backup
  if fsApi.exists(path) then
    backup = temp .. '.old'
    if fsApi.exists(backup) then pcall(fsApi.delete, backup) end
    local ok, err = pcall(fsApi.move, path, backup)
    if not ok then return false, errorText(err) end
  end
  local ok, err = pcall(fsApi.move, temp, path)
  if not ok then
    if backup then pcall(fsApi.move, backup, path) end
    return false, errorText(err)
  end
  if backup then pcall(fsApi.delete, backup) end
  return true
end

M.TEMP_SUFFIX = '.sandbox-part'
-- A write whose last part came this long ago (the gateway waits 30 s for each) was abandoned:
-- the next write of that file deletes what it left.
M.STALE_WRITE_MS = 120000

--[[ Each write builds its file in a temporary file of its own beside the target, named with
the writeId the gateway sends with every part (`.<name>.<writeId>.sandbox-part`), so two
writes of one file at once never share one: each moves a whole file into place (install),
never parts of both. A gateway older than writeId sends none: the one shared name
`.<name>.sandbox-part` is used then. What a write abandoned is deleted by the next write of
that file (clearStaleTemps). `dir` is fs.getDir(path), which the caller has. ]]
local function tempName(fsApi, path, writeId, dir)
  local name = fsApi.getName(path)
  if writeId then
    local stem = '.' .. name .. '.'
    if #stem + #writeId + #M.TEMP_SUFFIX >= 255 then stem = '.' .. name:sub(1, 200) .. '.' end
    return fsApi.combine(dir, stem .. writeId .. M.TEMP_SUFFIX)
  end
  return fsApi.combine(dir, '.' .. name .. M.TEMP_SUFFIX)
end

local LEFTOVER = '^%..+%.%x+' .. M.TEMP_SUFFIX:gsub('%p', '%%%0') .. '$'

--[[ The writes under way are known to the daemon (session.writing: temp -> {path, heard: the
clock at its last part, attempt: the connection it came on}). Before a write starts, every
write that is no longer under way is forgotten and its temporary file deleted, whatever file
it was for: one of an earlier connection (the gateway's requests ended with it), or idle for
M.STALE_WRITE_MS (the gateway gave up between two parts); so the table holds only the writes
under way, and nothing waits for the computer to reconnect. What the daemon
did not write (left by a run before this one: the computer rebooted) is found by looking
through the folder once in the daemon's run (session.scanned): every write's temporary file
there that no write under way holds. ]]
local function clearStaleTemps(fsApi, session, path, dir)
  local writing, now = session.writing, session.clock()
  for temp, write in pairs(writing) do
    if write.attempt ~= session.current or now - write.heard >= M.STALE_WRITE_MS then
      writing[temp] = nil -- (clearing a field while pairs() walks the table is allowed)
      pcall(fsApi.delete, temp)
    end
  end
  local legacy = tempName(fsApi, path, nil, dir)
  if not writing[legacy] and fsApi.exists(legacy) then pcall(fsApi.delete, legacy) end
  session.scanned = session.scanned or {}
  if session.scanned[dir] or not fsApi.isDir(dir) then return end
  session.scanned[dir] = true
  local ok, names = pcall(fsApi.list, dir)
  if not ok then return end
  for _, name in ipairs(names) do
    local full = fsApi.combine(dir, name)
    if name:find(LEFTOVER) and not writing[full] then pcall(fsApi.delete, full) end
  end
end

local function handleWriteFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi, payload = session.fs, req.payload
  local encoding = encodingOk(req)
  if not encoding then return end
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  if path == '' then return badRequest(req, 'path names a folder: /') end
  local data, most = req.raw, M.MAX_BINARY_CONTENT
  if encoding ~= 'binary' then
    if type(payload.content) ~= 'string' then return badRequest(req, 'content must be a base64 string') end
    local decodeErr
    data, decodeErr = M.base64Decode(payload.content)
    if not data then return badRequest(req, 'content: ' .. decodeErr) end
    most = M.MAX_CONTENT
  end
  if #data > most then
    return badRequest(req, ('%d bytes in one frame, at most %d: send parts'):format(#data, most))
  end
  local part = payload.part
  if part ~= nil and type(part) ~= 'table' then return badRequest(req, 'part must be {offset, final, size?}') end
  local offset, final, size, writeId = 0, true, #data, nil
  if part then
    local err
    offset, err = optionalNumber(part, 'offset', 0, 0)
    if not offset then return badRequest(req, 'part.' .. err) end
    final = part.final == true
    size, err = optionalNumber(part, 'size', offset + #data, offset + #data)
    if not size then return badRequest(req, 'part.' .. err) end
    writeId = part.writeId
    if writeId ~= nil and (type(writeId) ~= 'string' or not writeId:find('^%x+$') or #writeId > 32) then
      return badRequest(req, 'part.writeId must be at most 32 hex digits')
    end
  end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  if fsApi.isDir(path) then return fsError(req, shown .. ': Cannot write to directory') end
  -- A whole new file in one part goes straight to its place: there is no old file to keep,
  -- and nothing runs between this handler's open and close (fs calls do not yield).
  local direct = offset == 0 and final and not fsApi.exists(path)
  -- (fs.getDir is a function of the path alone: asked once, for every use below.)
  local dir = fsApi.getDir(path)

  -- Parts go to this write's temporary file beside the target; offset 0 starts it afresh.
  session.writing = session.writing or {}
  local writing = session.writing
  local temp, have = nil, 0
  if direct then
    if writeId then clearStaleTemps(fsApi, session, path, dir) end
  else
    temp = tempName(fsApi, path, writeId, dir)
    if M.isSettingsPath('/' .. temp) or M.isSettingsPath('/' .. temp .. '.old') then return settingsForbidden(req, shown) end
    if offset > 0 then
      have = fsApi.exists(temp) and fsApi.getSize(temp) or 0
      if offset ~= have then
        -- Left as it is, and still known (clearStaleTemps deletes it once it is stale, or the
        -- connection ends), should the part that follows on come after all.
        return badRequest(req, ('part.offset is %d but %d bytes of %s were received so far'):format(offset, have, shown))
      end
    else
      -- What a write abandoned half-way left (the gateway gone, the computer rebooted): ours.
      if writeId then writing[temp] = nil; clearStaleTemps(fsApi, session, path, dir) end
      if fsApi.exists(temp) then pcall(fsApi.delete, temp) end
    end
    if writeId then writing[temp] = { path = path, heard = session.clock(), attempt = session.current } end
  end
  local function done() if temp then writing[temp] = nil end end
  -- The space is known before anything is touched: with the first part, for the whole file
  -- (part.size, from a gateway that sends it), beside the file it replaces, which stays
  -- until the new one is whole (CC:Tweaked counts a file as at least FILE_OVERHEAD bytes).
  local free, missingDirs = freeSpaceFor(fsApi, path, dir)
  local need = #data
  if offset == 0 then need = math.max(size, M.FILE_OVERHEAD) + missingDirs * M.FILE_OVERHEAD end
  if free and need > free then
    if offset > 0 then pcall(fsApi.delete, temp) end
    done()
    local kept = fsApi.exists(path) and (shown .. ' is unchanged') or 'nothing was written'
    return fsError(req, ('Out of space: writing %s needs %d bytes, %d free (%s)'):format(shown, need, free, kept))
  end
  -- (Where the free space was asked, its folder was found there unless some were missing.)
  if (missingDirs > 0 or not free) and dir ~= '' and not fsApi.exists(dir) then
    local ok, err = pcall(fsApi.makeDir, dir)
    if not ok then done(); return fsError(req, errorText(err)) end
  end
  local ok, err = writeBytes(fsApi, direct and path or temp, offset == 0 and 'wb' or 'ab', data)
  if not ok then
    pcall(fsApi.delete, direct and path or temp)
    done()
    return fsError(req, err)
  end
  local size = have + #data
  if direct then
    done()
  elseif final then
    done()
    ok, err = install(fsApi, temp, path)
    if not ok then
      pcall(fsApi.delete, temp)
      return fsError(req, err)
    end
    size = fsApi.getSize(path)
  end
  req.respond(true, { bytesWritten = #data, sizeBytes = size })
end
-- write_file: parts into a temporary file, the final one moves it in
registerRequest('write_file', 'fs.write', handleWriteFile)

--[[ write_files {encoding = 'binary', writeId, files = {{path, size}, ...}}, as one binary
message whose bytes are the files' one after another: several whole files in one request (a
snapshot's restore), each written exactly as a write_file of one part writes it, in order,
stopping at the first that fails. -> {written = {{path, sizeBytes}}, failed? = {path, code,
message}}: the files before a failure stay written. ]]
local function handleWriteFiles(req, ctx)
  local payload, raw = req.payload, req.raw
  if payload.encoding ~= 'binary' or type(raw) ~= 'string' then
    return badRequest(req, 'write_files comes as a binary message (encoding "binary")')
  end
  local files = payload.files
  if type(files) ~= 'table' then return badRequest(req, 'files must be a list of {path, size}') end
  if #files > M.MAX_BATCH_FILES then
    return badRequest(req, ('at most %d files in one write_files'):format(M.MAX_BATCH_FILES))
  end
  local total = 0
  for i, file in ipairs(files) do
    local size = type(file) == 'table' and file.size
    if type(size) ~= 'number' or size < 0 or size % 1 ~= 0 then
      return badRequest(req, ('files[%d].size must be a whole number of bytes'):format(i))
    end
    total = total + size
  end
  if total ~= #raw then
    return badRequest(req, ('the files add up to %d bytes, but %d came'):format(total, #raw))
  end
  local written, at = {}, 1
  for _, file in ipairs(files) do
    local answer = {}
    local one = { messageId = req.messageId, type = 'write_file', raw = raw:sub(at, at + file.size - 1),
      payload = { path = file.path, encoding = 'binary',
        part = { offset = 0, final = true, size = file.size, writeId = payload.writeId } } }
    function one.respond(ok, result, err)
      answer.ok, answer.result, answer.err = ok, result, err
      return true
    end
    at = at + file.size
    local ran, err = pcall(handleWriteFile, one, ctx)
    if not ran and answer.ok == nil then answer.ok, answer.err = false, errorValue('internal', tostring(err)) end
    if not answer.ok then
      local err = answer.err or {}
      return req.respond(true, { written = jsonList(written),
        failed = { path = tostring(file.path), code = err.code, message = err.message } })
    end
    written[#written + 1] = { path = file.path, sizeBytes = answer.result.sizeBytes }
  end
  req.respond(true, { written = jsonList(written) })
end
-- write_files: several whole files in one binary message
registerRequest('write_files', 'fs.write', handleWriteFiles)

local function handleDeleteFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = filePath(req, fsApi, true)
  if not path then return end
  if path == '' then return badRequest(req, 'refusing to delete /') end
  if not fsApi.exists(path) then return req.respond(true, { deleted = false }) end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  local ok, err = pcall(fsApi.delete, path)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { deleted = not fsApi.exists(path) })
end
-- delete_file: {deleted}
registerRequest('delete_file', 'fs.write', handleDeleteFile)

-- A path of a move or a folder (see resolvePath) from payload[key], or nil once answered.
local function changedPath(req, fsApi, key)
  local path, shown = filePath(req, fsApi, true, key)
  if not path then return end
  if path == '' then return badRequest(req, key .. ' is the root folder, which cannot be changed') end
  if path == '..' or path:sub(1, 3) == '../' then return badRequest(req, key .. ' goes above the root folder') end
  return path, shown
end

local function within(child, parent)
  return child == parent or child:sub(1, #parent + 1) == parent .. '/'
end

--[[ move_file {from, to} -> {moved = true, from, to}: a file or a folder (with all in it) to a
path that does not exist yet, its missing folders made. Checked and done in one step, with no
yield between (fs calls do not yield), so nothing can be saved into `from` or made at `to`
between the check and the move, and nothing is deleted but by the move itself. Refused: `to`
inside `from` (or the same), `to` existing, either read-only, /.settings. ]]
local function handleMoveFile(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local from, fromShown = changedPath(req, fsApi, 'from')
  if not from then return end
  local to, toShown = changedPath(req, fsApi, 'to')
  if not to then return end
  if within(to, from) then return badRequest(req, ('to (%s) must not be from (%s) or inside it'):format(toShown, fromShown)) end
  if not fsApi.exists(from) then return fsError(req, fromShown .. ': No such file') end
  if fsApi.exists(to) then return fsError(req, toShown .. ': File exists') end
  if fsApi.isReadOnly(from) then return fsError(req, fromShown .. ': Access denied') end
  if fsApi.isReadOnly(to) then return fsError(req, toShown .. ': Access denied') end
  local dir = fsApi.getDir(to)
  if dir ~= '' and not fsApi.exists(dir) then
    local ok, err = pcall(fsApi.makeDir, dir)
    if not ok then return fsError(req, errorText(err)) end
  end
  local ok, err = pcall(fsApi.move, from, to)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { moved = true, from = fromShown, to = toShown })
end
-- move_file: {from, to}: checked and moved in one step
registerRequest('move_file', 'fs.write', handleMoveFile)

--[[ make_folder {path} -> {made, existed}: the folder and any missing above it (fs.makeDir);
one that exists already is left as it is (existed = true). Never deletes anything. ]]
local function handleMakeFolder(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local fsApi = session.fs
  local path, shown = changedPath(req, fsApi, 'path')
  if not path then return end
  if fsApi.isDir(path) then return req.respond(true, { made = shown, existed = true }) end
  if fsApi.exists(path) then return fsError(req, shown .. ': File exists') end
  if fsApi.isReadOnly(path) then return fsError(req, shown .. ': Access denied') end
  local ok, err = pcall(fsApi.makeDir, path)
  if not ok then return fsError(req, errorText(err)) end
  req.respond(true, { made = shown, existed = false })
end
-- make_folder: {path}: made, or left as it is
registerRequest('make_folder', 'fs.write', handleMakeFolder)

internal.freeSpaceFor = freeSpaceFor
