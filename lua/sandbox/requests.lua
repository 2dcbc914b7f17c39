local _VERSION = '0.1.0'

-- libsandbox's module sandbox/requests: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The request table ===========================================================
-- Owns: every gateway request type the daemon answers, the capability it needs (in the
-- setting sandbox.allow; none for ping and cancel) and its handler, in one place.
-- Needs: the request handlers. Exports: M.requestHandlers (type -> handler, what dispatch
-- calls) and M.REQUEST_CAPABILITY (type -> capability), both made from REQUESTS.

local M, internal = ...
local handleCallPeripheral = internal.handleCallPeripheral
local handleCancel = internal.handleCancel
local handleDeleteFile = internal.handleDeleteFile
local handleEval = internal.handleEval
local handleExec = internal.handleExec
local handleInput = internal.handleInput
local handleListFiles = internal.handleListFiles
local handleListPeripherals = internal.handleListPeripherals
local handleMakeFolder = internal.handleMakeFolder
local handleMoveFile = internal.handleMoveFile
local handlePeripheralEvents = internal.handlePeripheralEvents
local handlePing = internal.handlePing
local handleReadFile = internal.handleReadFile
local handleScreen = internal.handleScreen
local handleScreenWatch = internal.handleScreenWatch
local handleSnapshotList = internal.handleSnapshotList
local handleTurtle = internal.handleTurtle
local handleWriteFile = internal.handleWriteFile
local handleWriteFiles = internal.handleWriteFiles

-- SPEC §9 has the payloads and answers.
local REQUESTS = {
  -- type          capability  handler              what it does
  { 'ping',         nil,        handlePing },        -- {traposId}
  { 'exec',         'exec',     handleExec },        -- run a program beside the daemon; partials stream its output
  { 'eval',         'eval',     handleEval },        -- run Lua the same way; returns via textutils.serialize
  { 'cancel',       nil,        handleCancel },      -- {messageId} of a running exec, eval or screen_watch
  { 'list_files',   'fs.read',  handleListFiles },   -- {path, entries}
  { 'read_file',    'fs.read',  handleReadFile },    -- base64 (64 KiB) or binary (120 KiB) a part
  { 'write_file',   'fs.write', handleWriteFile },   -- parts into a temporary file, the final one moves it in
  { 'write_files',  'fs.write', handleWriteFiles },  -- several whole files in one binary message
  { 'delete_file',  'fs.write', handleDeleteFile },  -- {deleted}
  { 'move_file',    'fs.write', handleMoveFile },    -- {from, to}: checked and moved in one step
  { 'make_folder',  'fs.write', handleMakeFolder },  -- {path}: made, or left as it is
  { 'screen',       'screen',   handleScreen },      -- the whole screen's lines and colours
  { 'screen_watch', 'screen',   handleScreenWatch }, -- the screen, then its changes as partials (§14)
  { 'input',        'input',    handleInput },       -- {events}: keys, chars, paste, mouse, terminate (§14)
  { 'snapshot_list', 'fs.read', handleSnapshotList }, -- {files: [{path, size, modified}], total} outside /rom, drives, /.settings (§15)
  { 'list_peripherals', 'peripheral', handleListPeripherals }, -- {peripherals: [{name, types, methods}]} (§16)
  { 'call_peripheral', 'peripheral', handleCallPeripheral },   -- {returns} as JSON; peripheral_error
  { 'peripheral_events', 'peripheral', handlePeripheralEvents }, -- partials {type: "event", name, args}
  { 'turtle',       'turtle',   handleTurtle },      -- {returns, fuel, selected}; moves within the budget
}

M.requestHandlers, M.REQUEST_CAPABILITY = {}, {}
for _, entry in ipairs(REQUESTS) do
  local msgType, capability, handler = entry[1], entry[2], entry[3]
  M.requestHandlers[msgType] = handler
  M.REQUEST_CAPABILITY[msgType] = capability
end
