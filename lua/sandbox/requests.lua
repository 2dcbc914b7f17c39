local _VERSION = '0.1.0'

-- libsandbox's module sandbox/requests: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The request table ===========================================================
-- Owns: the request table, made of the types the handler modules registered (handlers, exec,
-- files, snapshot, console, peripherals: each with registerRequest where it defines its
-- handler), after the last of them ran; no type may be registered after it.
-- Needs: handlers and every module that registers. Exports: M.requestHandlers (type ->
-- handler, what dispatch calls) and M.REQUEST_CAPABILITY (type -> the capability it needs in
-- the setting sandbox.allow; none for ping and cancel).

local M, internal = ...

M.requestHandlers, M.REQUEST_CAPABILITY = {}, {}
for msgType, entry in pairs(internal.closeRequests()) do
  M.requestHandlers[msgType] = entry.handler
  M.REQUEST_CAPABILITY[msgType] = entry.capability
end
