local _VERSION = '0.1.0'

-- libsandbox's module sandbox/handlers: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Request handlers ============================================================
-- Owns: the registration of request types (registerRequest), what every request handler
-- shares (answers, numbers and lists from a payload, paths, /.settings refused) and ping. The
-- other handlers are in exec, files, snapshot, console and peripherals, each registered where
-- it is defined; sandbox/requests makes the request table of the registrations.
-- Needs: constants, encodings. Exports: M.isSettingsPath, M.SETTINGS_FILE; for the other
-- handlers: registerRequest, badRequest, fsError, errorText, sessionOf, optionalNumber,
-- stringList, resolvePath, settingsForbidden, filePath, encodingOk; for sandbox/requests:
-- closeRequests; for tests: foldedSettingsPath.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty

--[[ A handler is handler(req, ctx), registered with its type and capability by
registerRequest; sandbox/requests puts them in the request table (M.requestHandlers).
req = { messageId, type, payload (coerced), respond(ok, payload, err, shrink?) -> sent,
        partial(payload) -> sent }
ctx = the context onMessage was given (traposId, send, ... and, in a session, `session` and
`allowed(capability)`).
A handler answers through req.respond, at once or later (exec and eval stream partials first).
A handler that raises is answered with `internal`; a type missing from the table with
`unknown_type`; a type whose capability the owner has not allowed with `forbidden` (dispatch).
An answer that would encode over M.MAX_SEND is sent as `too_large` instead (after `shrink`, when
given, could not make it fit). ]]

-- Every request type the daemon answers, registered where its handler is defined:
-- type -> { capability = the name sandbox.allow must hold (nil: none), handler = fn }.
local registered, closed = {}, false

-- A gateway request type (SPEC §9 has its payload and answer), the capability it needs (nil for
-- none) and its handler. A type registered twice, or after the table was made, is an error.
local function registerRequest(msgType, capability, handler)
  expectNonEmpty(1, msgType)
  expect(2, capability, 'string', 'nil')
  expect(3, handler, 'function')
  if closed then
    error('request type ' .. msgType .. ' registered after the request table was made', 2)
  end
  if registered[msgType] then error('request type ' .. msgType .. ' registered twice', 2) end
  registered[msgType] = { capability = capability, handler = handler }
end

-- The registrations, once (sandbox/requests makes the request table of them); no more after.
local function closeRequests()
  closed = true
  return registered
end

local function handlePing(req, ctx)
  req.respond(true, { traposId = ctx.traposId })
end
-- ping: {traposId}
registerRequest('ping', nil, handlePing)

local function badRequest(req, message)
  req.respond(false, nil, errorValue('bad_request', message))
end

local function fsError(req, message)
  req.respond(false, nil, errorValue('fs_error', message))
end

-- CraftOS's own message, without a "file:line:" prefix a Lua error may carry.
local function errorText(err)
  local text = tostring(err)
  return (text:gsub('^[^%s:]+:%d+: ', ''))
end

local function sessionOf(req, ctx)
  if type(ctx.session) ~= 'table' then
    req.respond(false, nil, errorValue('internal', 'no sandbox session'))
    return nil
  end
  return ctx.session
end

local function optionalNumber(payload, key, default, min, max)
  local value = payload[key]
  if value == nil then return default end
  if type(value) ~= 'number' or value ~= value or value < min then
    return nil, ('%s must be a number of at least %d'):format(key, min)
  end
  if max and value > max then value = max end
  return math.floor(value)
end

-- A list field may arrive as {} or textutils.empty_json_array when empty (SPEC §2).
local function stringList(value, key)
  if value == nil then return {} end
  if type(value) ~= 'table' then return nil, key .. ' must be a list of strings' end
  local list = {}
  for i = 1, #value do
    if type(value[i]) ~= 'string' then return nil, key .. ' must be a list of strings' end
    list[i] = value[i]
  end
  for k in pairs(value) do
    if type(k) ~= 'number' or k < 1 or k > #value or k % 1 ~= 0 then return nil, key .. ' must be a list of strings' end
  end
  return list
end

-- A CraftOS path from payload[key]: absolute, or relative to payload.cwd (default /; the
-- cwd itself is relative to /). Returns the fs path ('' for the root) and the display path
-- ('/...'), or nil, message.
local function resolvePath(fsApi, payload, key, required)
  local path = payload[key]
  if path == nil and not required then path = '' end
  if type(path) ~= 'string' then return nil, key .. ' must be a string' end
  local cwd = key ~= 'cwd' and payload.cwd or nil
  if cwd ~= nil and type(cwd) ~= 'string' then return nil, 'cwd must be a string' end
  local full
  if path:sub(1, 1) == '/' or path:sub(1, 1) == '\\' then
    full = fsApi.combine('', path)
  else
    full = fsApi.combine(fsApi.combine('', cwd or ''), path)
  end
  return full, '/' .. full
end

--[[ The computer's credential stays on it (SPEC §9): /.settings holds sandbox.password, so
file requests may not read, list, write or delete it. CraftOS normalises a path before it
touches the disk, and differently in CC:Tweaked (fs.combine keeps `*`; fs.open drops it) and
CraftOS-PC (drops `"*:<>?|`, control and non-ASCII bytes, then folds `..`, trims spaces, drops
all-dot parts, cuts a long last part at 255), on hosts whose names may ignore case and trailing
dots and spaces. So a path is the settings file when, folded with the illegal characters
dropped before or after folding, its first part is `.settings` in any case with any trailing
dots or spaces (or a part of 255 bytes or more starting with it): the file, or a path under it
(which would make a folder of that name where the settings are saved). `..` above the root
stays at the root. The gateway refuses the same paths (trapsandbox/settingsfile.py, its twin). ]]
M.SETTINGS_FILE = '.settings'
local PATH_DROPPED = '[%c\128-\255"*:<>?|]'

local function foldPath(path)
  local parts = {}
  for raw in path:gmatch('[^/\\]+') do
    local part = raw:gsub('^[%c ]+', ''):gsub('[%c ]+$', '')
    if part == '..' then
      parts[#parts] = nil
    elseif part ~= '' and not part:find('^%.+$') then
      parts[#parts + 1] = part
    end
  end
  return parts
end

local function namesSettings(parts)
  if #parts == 0 then return false end
  local name = parts[1]:lower()
  if #name >= 255 then return name:sub(1, #M.SETTINGS_FILE) == M.SETTINGS_FILE end
  return (name:gsub('[%. ]+$', '')) == M.SETTINGS_FILE
end

-- The rule itself, on a path made absolute (see isSettingsPath): the parts of `joined` with the
-- dropped bytes removed before folding, and after.
local function foldedSettingsPath(joined)
  local folded = table.concat(foldPath(joined), '/')
  return namesSettings(foldPath((joined:gsub(PATH_DROPPED, ''))))
    or namesSettings(foldPath((folded:gsub(PATH_DROPPED, ''))))
end

-- Whether `path` (absolute, or relative to `cwd`, itself relative to /) is /.settings.
function M.isSettingsPath(path, cwd)
  local first = path:sub(1, 1)
  local joined = path
  if first ~= '/' and first ~= '\\' then joined = (cwd or '') .. '/' .. path end
  --[[ Most paths are decided without folding. With no byte that is dropped (PATH_DROPPED),
  dropping changes nothing, before or after folding, and folding a folded path again gives the
  same parts; so both checks below read the parts of foldPath(joined). Each of those is a run
  of joined's bytes (split at separators, ends trimmed), and namesSettings is true only when
  the first starts with `.settings` in any case. So a path with no dropped byte and no
  `.settings` (any case) among its bytes is not the settings file: foldedSettingsPath would
  say false too. (tests/lua/modules/handlers.lua and tests/unit/computers/test_settingsfile.py
  compare the two.) ]]
  if not joined:find(PATH_DROPPED) and not joined:lower():find(M.SETTINGS_FILE, 1, true) then
    return false
  end
  return foldedSettingsPath(joined)
end

local function settingsForbidden(req, shown)
  req.respond(false, nil, errorValue('forbidden', shown .. ' is this computer\'s settings file and holds its '
    .. 'sandbox password: file requests may not read, list, write or delete it'))
end

-- The path of a file request from payload[key or 'path'] (see resolvePath), or nil once the
-- request has been answered: bad_request, or forbidden for the settings file.
local function filePath(req, fsApi, required, key)
  key = key or 'path'
  local path, shown = resolvePath(fsApi, req.payload, key, required)
  if not path then return badRequest(req, shown) end
  -- The path as sent and as resolved: one check when they are one string (absolute, so the
  -- cwd is not read: the same call), as a gateway's canonical path is.
  local sent = req.payload[key] or ''
  if M.isSettingsPath(sent, req.payload.cwd) or (sent ~= shown and M.isSettingsPath(shown)) then
    return settingsForbidden(req, shown)
  end
  return path, shown
end

-- `encoding`: base64 (in the JSON), or binary: a write's bytes came after its header in a
-- binary message (req.raw), a read's go back that way (req.respondBinary). -> 'base64' or
-- 'binary', or nil once answered.
local function encodingOk(req)
  local encoding = req.payload.encoding
  if encoding == nil or encoding == 'base64' then return 'base64' end
  if encoding == 'binary' and (req.raw or (req.type == 'read_file' and req.respondBinary)) then
    return 'binary'
  end
  badRequest(req, 'encoding must be "base64"' .. (req.respondBinary and ' or "binary"' or ''))
end

internal.registerRequest = registerRequest
internal.closeRequests = closeRequests
internal.badRequest = badRequest
internal.fsError = fsError
internal.errorText = errorText
internal.sessionOf = sessionOf
internal.optionalNumber = optionalNumber
internal.stringList = stringList
internal.resolvePath = resolvePath
internal.settingsForbidden = settingsForbidden
internal.filePath = filePath
internal.foldedSettingsPath = foldedSettingsPath
internal.encodingOk = encodingOk
