local _VERSION = '0.1.0'

-- libsandbox's module sandbox/jobs: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Jobs ========================================================================
-- Owns: a program (exec) or a Lua chunk (eval) running in its own coroutine beside the daemon:
-- resuming it with its terminal and capture in place, timeout, cancel, streamed partials.
-- Needs: constants, event loop, capture. Exports: nothing (startJob and stopJobs, for the
-- request handlers and the session).

local M, internal = ...
local capturedPrintError = internal.capturedPrintError
local capturedWrite = internal.capturedWrite
local errorValue = internal.errorValue
local listenAll = internal.listenAll
local swapped = internal.swapped

--[[ A job is resumed from the daemon's event loop like `parallel` resumes its coroutines: with
every event that matches the filter it yielded (all events when none), and `terminate` always.
On timeoutMs, cancel, or the end of its connection it is resumed once with `terminate`; if it
has not ended M.TERMINATE_GRACE s later it is abandoned. Output streams back as partial
responses, coalesced; before the final answer whatever is still buffered is sent, so the
partials always carry the whole captured output and the final answer repeats it. ]]
local Job = {}
Job.__index = Job

local function startJob(session, req, spec)
  if session.jobs[req.messageId] then
    return req.respond(false, nil, errorValue('bad_request', 'a request with this messageId is running'))
  end
  if session.jobCount >= M.MAX_JOBS then
    return req.respond(false, nil, errorValue('overloaded', ('%d programs are running already'):format(session.jobCount)))
  end
  local job = setmetatable({
    session = session, req = req, spec = spec, attempt = session.current,
    capture = M.newCapture(spec.maxOutputBytes, spec.mergeStderr),
    co = coroutine.create(spec.body), dir = spec.cwd, startedAt = session.clock(),
    done = false, filter = nil, stopReason = nil, lastPartial = nil,
  }, Job)
  if session.term and session.term.current and session.term.redirect then
    -- Draw where the player looks: the recorded screen (the shell's), else our own terminal.
    local ok, parent = pcall(session.screen)
    if not ok or type(parent) ~= 'table' then ok, parent = pcall(session.term.current) end
    if ok and type(parent) == 'table' then job.term = job.capture:terminal(parent) end
  end
  session.jobs[req.messageId] = job
  session.jobCount = session.jobCount + 1
  job.dispose = listenAll(session.loop, function(...) job:onEvent(...) end)
  job.clearTimeout = session.loop.setTimeout(function()
    job.clearTimeout = nil
    job:stop('timeout')
  end, spec.timeoutMs / 1000)
  job:resume()
end

-- Stops the jobs started on `attempt` (all jobs when nil), for `reason` (default 'disconnect').
local function stopJobs(session, attempt, reason)
  local list = {}
  for _, job in pairs(session.jobs) do
    if attempt == nil or job.attempt == attempt then list[#list + 1] = job end
  end
  for _, job in ipairs(list) do job:stop(reason or 'disconnect') end
end

function Job:onEvent(event, ...)
  if self.done then return end
  if self.filter == nil or self.filter == event or event == 'terminate' then
    self:resume(event, ...)
  end
end

-- One resume, with the program's terminal, output capture and working directory in place
-- and everything put back afterwards.
function Job:resume(...)
  if self.done then return end
  local session = self.session
  local termApi, shellApi = session.term, session.shell
  local prevTerm
  if self.term then
    prevTerm = termApi.current()
    termApi.redirect(self.term)
  end
  local prevWrite, prevPrintError = rawget(_G, 'write'), rawget(_G, 'printError')
  if prevWrite ~= capturedWrite then swapped.write = prevWrite; rawset(_G, 'write', capturedWrite) end
  if prevPrintError ~= capturedPrintError then swapped.printError = prevPrintError; rawset(_G, 'printError', capturedPrintError) end
  local prevDir
  if shellApi and self.dir then
    prevDir = shellApi.dir()
    pcall(shellApi.setDir, self.dir)
  end
  local prevCapture = swapped.capture
  swapped.capture = self.capture
  self.capture.depth = 0

  local result = table.pack(coroutine.resume(self.co, ...))

  swapped.capture = prevCapture
  if prevDir then
    self.dir = shellApi.dir()
    pcall(shellApi.setDir, prevDir)
  end
  if rawget(_G, 'write') == capturedWrite then rawset(_G, 'write', prevWrite) end
  if rawget(_G, 'printError') == capturedPrintError then rawset(_G, 'printError', prevPrintError) end
  if prevTerm then
    self.term = termApi.current()
    termApi.redirect(prevTerm)
  end

  if coroutine.status(self.co) == 'dead' then
    self:finish(result)
  else
    if result[1] then self.filter = result[2] end
    self:flushOutput(false)
  end
end

-- Sends pending output as partials: at once when the last partial is M.PARTIAL_INTERVAL_MS
-- old or the run holds M.PARTIAL_MIN_BYTES; otherwise one timer sends it later.
function Job:flushOutput(force)
  local session, cap = self.session, self.capture
  while cap.pending[1] do
    local now = session.clock()
    local wait = self.lastPartial and (self.lastPartial + M.PARTIAL_INTERVAL_MS - now) or 0
    if not force and wait > 0 and cap.pending[1].bytes < M.PARTIAL_MIN_BYTES then
      if not self.clearFlush then
        self.clearFlush = session.loop.setTimeout(function()
          self.clearFlush = nil
          if not self.done then self:flushOutput(false) end
        end, wait / 1000)
      end
      return
    end
    local name, data = cap:takePending(M.PARTIAL_MAX_BYTES)
    self.req.partial({ type = name .. '_delta', data = data })
    self.lastPartial = now
  end
end

function Job:stop(reason)
  if self.done then return false end
  if reason == 'cancel' or not self.stopReason then self.stopReason = reason end
  self:resume('terminate')
  if not self.done and not self.clearGrace then
    self.clearGrace = self.session.loop.setTimeout(function()
      self.clearGrace = nil
      self.abandoned = true
      self:finish({ false, 'still running after terminate: abandoned', n = 2 })
    end, M.TERMINATE_GRACE)
  end
  return true
end

-- Halves the longest output string of an answer that does not fit in one frame.
local function shrinkOutput(answer)
  local holder, key, longest = nil, nil, 0
  local function consider(t, k)
    if type(t[k]) == 'string' and #t[k] > longest then holder, key, longest = t, k, #t[k] end
  end
  consider(answer, 'stdout')
  consider(answer, 'stderr')
  if type(answer.returns) == 'table' then
    for i = 1, #answer.returns do consider(answer.returns, i) end
  end
  if not holder or longest < 2 then return false end
  holder[key] = holder[key]:sub(1, math.floor(longest / 2))
  if holder == answer then answer[key .. 'Truncated'] = true end
  return true
end

function Job:finish(result)
  if self.done then return end
  self.done = true
  local session = self.session
  if self.dispose then self.dispose() end
  for _, clear in ipairs({ 'clearTimeout', 'clearGrace', 'clearFlush' }) do
    if self[clear] then self[clear](); self[clear] = nil end
  end
  session.jobs[self.req.messageId] = nil
  session.jobCount = session.jobCount - 1
  local answer, failure = self.spec.answer(self, result)
  self:flushOutput(true)
  if self.stopReason == 'cancel' then
    self.req.respond(false, nil, errorValue('cancelled', 'cancelled by the gateway'))
  elseif self.stopReason == 'stopped' then
    self.req.respond(false, nil, self.session:stopReason() or errorValue('stopped', 'stopped on the computer'))
  elseif failure then
    self.req.respond(false, nil, failure)
  else
    self.req.respond(true, answer, nil, shrinkOutput)
  end
end

function Job:durationMs()
  return math.max(0, math.floor(self.session.clock() - self.startedAt))
end

internal.startJob = startJob
internal.stopJobs = stopJobs
