local _VERSION = '0.1.0'

-- libsandbox's module sandbox/exec: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Programs ====================================================================
-- Owns: exec (a program beside the daemon) and eval (a Lua chunk), run as jobs, and cancel.
-- Needs: constants, handlers, jobs. Exports: M.PROGRAM_PATH. Registers exec, eval and cancel
-- (registerRequest, sandbox/handlers).

local M, internal = ...
local badRequest = internal.badRequest
local jsonList = internal.jsonList
local optionalNumber = internal.optionalNumber
local registerRequest = internal.registerRequest
local resolvePath = internal.resolvePath
local sessionOf = internal.sessionOf
local startJob = internal.startJob
local stringList = internal.stringList

local function timeoutAndOutput(payload)
  local timeoutMs, err = optionalNumber(payload, 'timeoutMs', M.EXEC_TIMEOUT_MS, 1)
  if not timeoutMs then return nil, err end
  local maxOutput
  maxOutput, err = optionalNumber(payload, 'maxOutputBytes', M.MAX_OUTPUT_BYTES, 0, M.MAX_OUTPUT_BYTES)
  if not maxOutput then return nil, err end
  return timeoutMs, maxOutput
end

-- exec without a shell (a daemon started with none): resolve like the shell and run the file.
M.PROGRAM_PATH = { '/rom/programs', '/rom/programs/http', '/rom/programs/advanced', '/rom/programs/fun', '/programs' }

local function findProgram(fsApi, command, cwd)
  local function found(path)
    if fsApi.exists(path) and not fsApi.isDir(path) then return path end
    if fsApi.exists(path .. '.lua') and not fsApi.isDir(path .. '.lua') then return path .. '.lua' end
  end
  if command:find('[/\\]') then
    if command:find('^[/\\]') then return found(fsApi.combine('', command)) end
    return found(fsApi.combine(cwd, command))
  end
  local hit = found(fsApi.combine(cwd, command))
  if hit then return hit end
  for _, dir in ipairs(M.PROGRAM_PATH) do
    hit = found(fsApi.combine(dir, command))
    if hit then return hit end
  end
end

local function runWithoutShell(fsApi, command, args, cwd)
  local report = function(message) local pe = rawget(_G, 'printError') or print; pe(message) end
  local path = findProgram(fsApi, command, cwd)
  if not path then report('No such program'); return false end
  local handle, openErr = fsApi.open(path, 'r')
  if not handle then report(openErr or ('cannot open ' .. path)); return false end
  local source = handle.readAll()
  handle.close()
  local env = setmetatable({ arg = { [0] = command, table.unpack(args) } }, { __index = _G })
  local fn, loadErr = load(source or '', '@/' .. path, 't', env)
  if not fn then report(loadErr); return false end
  local ok, err = pcall(fn, table.unpack(args))
  if not ok then
    if err ~= nil and err ~= '' then report(err) end
    return false
  end
  return true
end

local function execAnswer(job, result)
  local cap = job.capture
  -- An error that escaped the program (not printed by the shell) still goes to stderr.
  if not result[1] then cap:record('stderr', tostring(result[2]) .. '\n') end
  local answer = {
    exitCode = (result[1] and result[2] == true) and 0 or 1,
    timedOut = job.stopReason == 'timeout',
    durationMs = job:durationMs(),
    stdout = cap:text('stdout'),
    stderr = cap:text('stderr'),
  }
  if cap.stdout.truncated then answer.stdoutTruncated = true end
  if cap.stderr.truncated then answer.stderrTruncated = true end
  return answer
end

local function handleExec(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local payload, fsApi = req.payload, session.fs
  local command = payload.command
  if type(command) ~= 'string' or command == '' then return badRequest(req, 'command must be a non-empty string') end
  local args, err = stringList(payload.args, 'args')
  if not args then return badRequest(req, err) end
  local cwd
  cwd, err = resolvePath(fsApi, payload, 'cwd', false)
  if not cwd then return badRequest(req, err) end
  if not fsApi.isDir(cwd) then return badRequest(req, 'cwd /' .. cwd .. ' is not a directory') end
  local timeoutMs, maxOutput = timeoutAndOutput(payload)
  if not timeoutMs then return badRequest(req, maxOutput) end
  local shellApi = session.shell
  local body
  if shellApi and shellApi.execute then
    body = function() return shellApi.execute(command, table.unpack(args)) end
  else
    body = function() return runWithoutShell(fsApi, command, args, cwd) end
  end
  startJob(session, req, {
    body = body, cwd = shellApi and cwd or nil, timeoutMs = timeoutMs, maxOutputBytes = maxOutput,
    answer = execAnswer,
  })
end
-- exec: run a program beside the daemon; partials stream its output
registerRequest('exec', 'exec', handleExec)

local function serializeValue(textutilsApi, value)
  if textutilsApi and textutilsApi.serialize then
    local ok, text = pcall(textutilsApi.serialize, value)
    if ok and type(text) == 'string' then return text end
  end
  return tostring(value)
end

-- eval has one output stream: printError output goes to stdout too.
local function evalAnswer(job, result)
  local cap = job.capture
  local answer = {
    ok = result[1] == true and not job.abandoned,
    returns = {},
    stdout = cap:text('stdout'),
    durationMs = job:durationMs(),
    timedOut = job.stopReason == 'timeout',
  }
  if answer.ok then
    for i = 2, result.n do answer.returns[i - 1] = serializeValue(job.session.textutils, result[i]) end
  else
    answer.error = tostring(result[2])
  end
  answer.returns = jsonList(answer.returns)
  if cap.stdout.truncated then answer.stdoutTruncated = true end
  return answer
end

-- The environment eval code runs in: reads fall through to the computer's globals, assignments
-- stay here, and it lasts for the session (like the Lua prompt, `x = 1` then `return x` works).
local function evalEnv(session)
  if not session.evalGlobals then
    session.evalGlobals = setmetatable({ shell = session.shell, multishell = session.multishell }, { __index = _G })
  end
  return session.evalGlobals
end

local function handleEval(req, ctx)
  local session = sessionOf(req, ctx)
  if not session then return end
  local code = req.payload.code
  if type(code) ~= 'string' or code == '' then return badRequest(req, 'code must be a non-empty string') end
  local timeoutMs, maxOutput = timeoutAndOutput(req.payload)
  if not timeoutMs then return badRequest(req, maxOutput) end
  local env = evalEnv(session)
  -- Like the Lua prompt: an expression first, then statements.
  local fn, err = load('return ' .. code, '=eval', 't', env)
  if not fn then fn, err = load(code, '=eval', 't', env) end
  if not fn then
    return req.respond(true, { ok = false, returns = jsonList({}), stdout = '', error = tostring(err), durationMs = 0, timedOut = false })
  end
  startJob(session, req, {
    body = fn, timeoutMs = timeoutMs, maxOutputBytes = maxOutput, mergeStderr = true, answer = evalAnswer,
  })
end
-- eval: run Lua the same way; returns via textutils.serialize
registerRequest('eval', 'eval', handleEval)

local function handleCancel(req, ctx)
  local messageId = req.payload.messageId
  if type(messageId) ~= 'string' or messageId == '' then return badRequest(req, 'messageId must be a non-empty string') end
  local session = type(ctx.session) == 'table' and ctx.session or nil
  -- A running exec or eval (a job), or a screen_watch.
  local running = session and (session.jobs[messageId] or session.watches[messageId]) or nil
  req.respond(true, { cancelled = running ~= nil and running:stop('cancel') or false })
end
-- cancel: {messageId} of a running exec, eval or screen_watch
registerRequest('cancel', nil, handleCancel)
