local _VERSION = '0.1.0'

-- libsandbox's module sandbox/session: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: The session (the daemon) ====================================================
-- Owns: the one WebSocket to the gateway: connect, hello, reconnect with backoff, forwarding
-- programs' requests, announcing capabilities, the published state; startSession.
-- Needs: everything above (dispatch for frames, jobs to stop them). Exports: M.startSession.

local M, internal = ...
local defaultDecode = internal.defaultDecode
local defaultEncode = internal.defaultEncode
local dropEventName = internal.dropEventName
local encodeFrame = internal.encodeFrame
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty
local field = internal.field
local jsonList = internal.jsonList
local stopJobs = internal.stopJobs
local stopWatches = internal.stopWatches

--[[ A session moves through these states (`session.state()`):
  connecting   websocketAsync called, waiting for websocket_success (connectTimeout)
  handshaking  hello sent, waiting for its answer (helloTimeout)
  ready        hello answered ok: program requests are forwarded, gateway requests answered
  waiting      the attempt failed; a reconnect is scheduled (backoff)
  stopped      for good: unauthorized, replaced, or stop() was called
Every recoverable failure goes through one transition, `fail(err)`: record the error, end the
attempt (timers cleared, handle closed once, pending sends failed) and schedule a reconnect.
`stopForGood(err)` is the terminal one. Gateway requests go to M.requestHandlers through
onMessage; the connection code knows nothing about them. ]]
local Session = {}
Session.__index = Session

function Session:publish()
  local published = self.published
  if not published then return end
  published.running = not self.stopped
  published.state = self.state
  published.connected = self.state == 'ready'
  published.traposId = self.traposId
  published.url = self.baseUrl
  published.lastError = self.lastError
  published.accountId = self.accountId
  published.version = _VERSION
  published.capabilities = self:capabilities()
  local stopped = self:stopReason()
  published.agentStopped = stopped ~= nil
  published.stopMessage = stopped and stopped.message or nil
  published.updated = self.os.epoch and self.os.epoch('utc') or nil
end

function Session:queue(...)
  local ok, err = pcall(self.os.queueEvent, ...)
  if not ok then self.log('queueEvent failed: ' .. tostring(err)) end
end

function Session:reply(messageId, err)
  self:queue(M.EVENT_REPLY, messageId, false, nil, err)
end

function Session:closeHandle(handle)
  if handle == nil or self.closedHandles[handle] then return end
  self.closedHandles[handle] = true
  local ok, err = pcall(handle.close)
  if not ok then self.log('close failed: ' .. tostring(err)) end
end

function Session:sendOn(handle, text, binary)
  if handle == nil or self.closedHandles[handle] then return false, 'connection closed' end
  if type(text) ~= 'string' or text == '' then return false, 'refusing to send an empty message' end
  local ok, err = pcall(handle.send, text, binary)
  if not ok then return false, tostring(err) end
  return true
end

function Session:failInFlight(message)
  local ids = self.inFlight
  self.inFlight, self.inFlightCount, self.asking = {}, 0, nil
  for id in pairs(ids) do
    self:reply(id, errorValue('not_connected', message))
  end
end

local function clearAttemptTimers(attempt)
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
end

-- Ends the current attempt: timers cleared, handle closed once, pending sends failed.
function Session:endAttempt(message)
  local attempt = self.current
  if not attempt or attempt.done then return end
  attempt.done = true
  clearAttemptTimers(attempt)
  self:closeHandle(attempt.handle)
  self:failInFlight(message or 'connection lost')
  -- Their answers could only go on this connection: programs and watches it started are stopped.
  stopJobs(self, attempt)
  stopWatches(self, attempt)
end

function Session:clearReconnect()
  if self.cancelReconnect then self.cancelReconnect(); self.cancelReconnect = nil end
end

function Session:scheduleReconnect()
  if self.terminal or self.stopped then return end
  self.failures = self.failures + 1
  local base = self.backoffMin
  for _ = 2, self.failures do
    base = base * 2
    if base >= self.backoffMax then base = self.backoffMax; break end
  end
  if base > self.backoffMax then base = self.backoffMax end
  local delay = base * (1 - self.backoffJitter * self.random())
  self.state = 'waiting'
  self:publish()
  self.log(('reconnecting in %.1f s'):format(delay))
  self:clearReconnect()
  self.cancelReconnect = self.loop.setTimeout(function()
    self.cancelReconnect = nil
    self:connect()
  end, delay)
end

-- The one transition for every recoverable failure.
function Session:fail(err)
  self.lastError = err
  self:endAttempt(err.message)
  self:scheduleReconnect()
end

function Session:stopForGood(err)
  self.terminal = true
  self.lastError = err
  self:endAttempt(err.code .. ': ' .. (err.message or ''))
  self:clearReconnect()
  self.state = 'stopped'
  self:publish()
  self.log('stopped: ' .. err.code .. ' ' .. (err.message or ''))
end

function Session:isCurrent(url)
  local attempt = self.current
  return attempt ~= nil and not attempt.done and url == attempt.url
end

-- Arms a timer that fails the attempt if it is still in `state` when it fires.
function Session:deadline(attempt, state, seconds, makeError)
  return self.loop.setTimeout(function()
    if self.current == attempt and not attempt.done and self.state == state then
      self:fail(makeError())
    end
  end, seconds)
end

-- connecting ----------------------------------------------------------------------

function Session:connect()
  if self.terminal or self.stopped then return end
  self.attempts = self.attempts + 1
  local attempt = { url = M.withNonce(self.baseUrl, ('%s-%d'):format(self.tag, self.attempts)) }
  self.current = attempt
  self.state = 'connecting'
  self:publish()
  attempt.clearConnect = self:deadline(attempt, 'connecting', self.connectTimeout, function()
    return errorValue('not_connected', 'connection attempt timed out')
  end)
  local ok, result, err = pcall(self.http.websocketAsync, attempt.url, self.headers)
  if not ok or result == false then
    -- CC:Tweaked may also queue websocket_failure for this URL; the attempt is done by then.
    self:fail(errorValue('not_connected', tostring(ok and (err or 'websocket refused') or result)))
  end
end

-- Whether `url` is one of this session's attempts: their nonces start with its tag.
-- Websocket events reach every program and tab; only these are the daemon's business.
function Session:owns(url)
  return type(url) == 'string' and url:find('n=' .. self.tag .. '-', 1, true) ~= nil
end

-- connecting -> handshaking: the socket is open, send hello. Only a handle this session asked
-- for is touched: another program's (another tab's, another daemon's) is none of its business.
function Session:onOpen(url, handle)
  if not self:owns(url) then return end
  local attempt = self.current
  if not self:isCurrent(url) or attempt.handle then
    -- A late success for an attempt this session abandoned: nobody will use it, free the slot.
    if type(handle) == 'table' and handle ~= attempt.handle then self:closeHandle(handle) end
    return
  end
  attempt.handle = handle
  if attempt.clearConnect then attempt.clearConnect(); attempt.clearConnect = nil end
  self.state = 'handshaking'
  self:publish()
  attempt.helloId = M.newMessageId(self.os)
  local capabilities = self:capabilities()
  self.announced = table.concat(capabilities, ',')
  local stopped = self:stopReason()
  self.announcedStop = stopped and stopped.message or ''
  local okEncode, text = pcall(self.encode,
    M.hello(self.traposId, attempt.helloId, self.secret, _VERSION, capabilities, stopped))
  local sent, sendErr = false, text
  if okEncode then sent, sendErr = self:sendOn(handle, text) end
  if not sent then
    self:fail(errorValue('not_connected', 'could not send hello: ' .. tostring(sendErr)))
    return
  end
  attempt.clearHello = self:deadline(attempt, 'handshaking', self.helloTimeout, function()
    return errorValue('timeout', ('no hello answer within %d s'):format(self.helloTimeout))
  end)
end

-- handshaking -> ready, stopped (unauthorized) or waiting.
function Session:onHello(messageId, ok, payload, err)
  local attempt = self.current
  if self.state ~= 'handshaking' or not attempt or attempt.done or messageId ~= attempt.helloId then return end
  if attempt.clearHello then attempt.clearHello(); attempt.clearHello = nil end
  if ok then
    self.state = 'ready'
    self.failures = 0
    self.lastError = nil
    self.accountId = payload and payload.accountId or nil
    self:publish()
    self.log('connected as ' .. self.traposId)
    self:queue(M.EVENT_CONNECTED, self.traposId)
    self:announceCapabilities() -- in case they changed since hello was sent
    self:announceStop(self:stopReason())
  elseif err and err.code == 'unauthorized' then
    self:stopForGood(err)
  else
    self:fail(err or errorValue('internal', 'hello failed'))
  end
end

-- Any state: the socket failed or closed.
function Session:onFailure(url, err)
  if not self:isCurrent(url) then return end
  local message = 'connection failed: ' .. tostring(err or 'unknown error')
  if type(err) == 'string' and err:find('not permitted', 1, true) then message = M.notPermitted(self.baseUrl, err) end
  self:fail(errorValue('not_connected', message))
end

--[[ CC:Tweaked's http.rules deny the gateway's host ("Domain not permitted"): by default every
private and local address is, so a gateway on the server's own machine or its LAN needs an
allow rule in front of the $private one. Only the server admin can add it: say exactly what. ]]
function M.notPermitted(url, err)
  local host = url:match('^%a+://%[([^%]]+)%]') or url:match('^%a+://([^/:?]+)') or url
  return ('%s: the Minecraft server does not let computers reach %s. The server admin must add, '
    .. 'before the $private rule in serverconfig/computercraft-server.toml: '
    .. '[[http.rules]] host = "%s" action = "allow"'):format(tostring(err), host, host)
end

function Session:onClosed(url, reason, code)
  if not self:isCurrent(url) then return end
  local attempt = self.current
  -- The socket is gone: make sure we never call close() on it afterwards.
  if attempt.handle then self.closedHandles[attempt.handle] = true end
  local detail = (type(reason) == 'string' and reason ~= '') and reason or nil
  if code == M.CLOSE_REPLACED then
    self:stopForGood(errorValue('replaced', detail or 'replaced by a newer connection with the same traposId'))
    return
  end
  if code == M.CLOSE_UNAUTHORIZED then
    self:stopForGood(errorValue('unauthorized', detail or 'the gateway rejected the password'))
    return
  end
  local message = 'connection closed'
  if code then message = message .. ' (' .. tostring(code) .. (detail and (' ' .. detail) or '') .. ')' end
  self:fail(errorValue('not_connected', message))
end

-- handshaking and ready: a frame from the gateway.
function Session:onFrame(url, content, isBinary)
  local attempt = self.current
  if not self:isCurrent(url) or not attempt.handle then return end
  local raw
  if isBinary then
    -- A file part (docs/protocol.md): its request as JSON, a newline, its bytes.
    if not M.binaryParts() or type(content) ~= 'string' then return end
    local newline = content:find('\n', 1, true)
    if not newline then return end
    content, raw = content:sub(1, newline - 1), content:sub(newline + 1)
  end
  if not attempt.ctx then
    local handle = attempt.handle
    attempt.ctx = {
      traposId = self.traposId,
      session = self,
      encode = self.encode,
      decode = self.decode,
      send = function(text) return self:sendOn(handle, text) end,
      sendBinary = M.binaryParts() and function(message) return self:sendOn(handle, message, true) end or nil,
      queueEvent = function(...) self:queue(...) end,
      onHello = function(...) self:onHello(...) end,
      onReply = function(messageId, ok, _, err) return self:onReply(messageId, ok, err) end,
      allowed = function(capability) return self:allows(capability) end,
      stopped = function() return self:stopReason() end,
    }
  end
  M.onMessage(content, attempt.ctx, raw)
end

-- Returns true for the answer to one of the daemon's own requests (nobody waits for it).
function Session:onReply(messageId, ok, err)
  if self.ownRequests[messageId] then
    self.ownRequests[messageId] = nil
    if not ok then self.log('gateway refused ' .. messageId .. ': ' .. tostring(err and err.message)) end
    return true
  end
  if self.inFlight[messageId] then
    self.inFlight[messageId] = nil
    self.inFlightCount = self.inFlightCount - 1
  end
  if self.asking == messageId then self.asking = nil end
end

-- Capabilities: the live setting is what counts; the gateway hears of every change. ----

function Session:capabilities()
  local value = nil
  if self.settings and self.settings.get then value = self.settings.get('sandbox.allow') end
  return M.parseCapabilities(value)
end

function Session:allows(capability)
  local list = self:capabilities()
  self:announceCapabilities(list)
  for _, name in ipairs(list) do
    if name == capability then return true end
  end
  return false
end

-- Sends a computer_request of the client's own (its answer is only logged); whether it went.
local function sendOwn(self, msgType, payload, what)
  local messageId = M.newMessageId(self.os)
  local text = encodeFrame(self, M.computerRequest(self.traposId, messageId, msgType, payload))
  local sent, err = self:sendOn(self.current.handle, text)
  if not sent then
    self.log('could not announce ' .. what .. ': ' .. tostring(err))
    return false
  end
  self.ownRequests[messageId] = true
  return true
end

-- Sends computer_request `capabilities` when the allowed list differs from the one last
-- announced (in hello or here). Called on trapos_sandbox_capabilities and before each check.
function Session:announceCapabilities(list)
  if type(list) ~= 'table' then list = self:capabilities() end
  local key = table.concat(list, ',')
  if self.published then self.published.capabilities = list end
  if self.state ~= 'ready' or key == self.announced then return false end
  if not sendOwn(self, 'capabilities', { capabilities = jsonList(list) }, 'capabilities') then
    return false
  end
  self.announced = key
  self.log('capabilities: ' .. (key == '' and 'none' or key))
  return true
end

-- Stop (SPEC §16): the player's brake, read live like the capabilities. ------------------

-- Why the agent is stopped here ({code = 'stopped', message} saying how to resume), or nil.
function Session:stopReason()
  local settingsApi = self.settings
  if settingsApi and settingsApi.get and settingsApi.get('sandbox.stopped') == true then
    return errorValue('stopped', ('the player stopped the sandbox agent on computer %s; on it, run "sandbox resume"')
      :format(self.traposId))
  end
  local side = settingsApi and settingsApi.get and settingsApi.get('sandbox.stop_side')
  local redstoneApi = self.redstone
  if type(side) == 'string' and side ~= '' and redstoneApi and redstoneApi.getInput then
    local ok, on = pcall(redstoneApi.getInput, side)
    if ok and on then
      return errorValue('stopped', ('a redstone signal on the %s side of computer %s stops the sandbox agent: '
        .. 'turn it off to resume'):format(side, self.traposId))
    end
  end
end

-- On sandbox stop / resume and on every redstone change: once stopped, every running request
-- (programs, Lua, watches, peripheral calls) ends with `stopped`; new ones are refused (dispatch).
-- The gateway is told (announceStop): it ends the running ask and shows the computer stopped.
function Session:onStopChange()
  local reason = self:stopReason()
  local stopped = reason ~= nil
  if stopped and not self.halted then
    stopJobs(self, nil, 'stopped')
    stopWatches(self, nil, 'stopped')
  end
  self.halted = stopped
  self:publish()
  self:announceStop(reason)
end

-- Sends computer_request `stopped {stopped, stopMessage?}` when the stop state differs from the
-- one last announced (in hello or here), like announceCapabilities. A gateway older than this
-- request answers unknown_type, which is only logged. `stopped`: stopReason()'s answer.
function Session:announceStop(stopped)
  local key = stopped and stopped.message or ''
  if self.state ~= 'ready' or key == self.announcedStop then return false end
  local payload = { stopped = stopped ~= nil, stopMessage = stopped and stopped.message or nil }
  if not sendOwn(self, 'stopped', payload, 'the stop') then return false end
  self.announcedStop = key
  self.log(stopped and 'agent stopped: the gateway is told' or 'agent resumed: the gateway is told')
  return true
end

-- ready: a program asks to send a request (trapos_sandbox_send); anything else answers at once.
function Session:forward(messageId, msgType, payload)
  if type(messageId) ~= 'string' or messageId == '' then return end
  if type(msgType) ~= 'string' or msgType == '' then
    self:reply(messageId, errorValue('bad_request', 'type must be a non-empty string'))
    return
  end
  if self.state ~= 'ready' then
    local err = self.lastError
    if not (self.terminal and err) then
      err = errorValue('not_connected', 'not connected to the sandbox gateway' ..
        (err and (' (' .. tostring(err.message) .. ')') or ''))
    end
    self:reply(messageId, err)
    return
  end
  local okEncode, text = pcall(self.encode, M.computerRequest(self.traposId, messageId, msgType, M.coercePayload(payload)))
  if not okEncode or type(text) ~= 'string' or text == '' then
    self:reply(messageId, errorValue('bad_request', 'cannot encode: ' .. tostring(text)))
    return
  end
  if #text > M.MAX_SEND then
    self:reply(messageId, errorValue('too_large', ('message of %d bytes'):format(#text)))
    return
  end
  local sent, err = self:sendOn(self.current.handle, text)
  if not sent then
    self:reply(messageId, errorValue('not_connected', 'send failed: ' .. tostring(err)))
    self:fail(errorValue('not_connected', 'send failed: ' .. tostring(err)))
    return
  end
  -- The map only makes a drop answer pending requests; past the cap, forget the oldest batch.
  if self.inFlightCount >= M.MAX_IN_FLIGHT then self.inFlight, self.inFlightCount = {}, 0 end
  self.inFlight[messageId] = true
  self.inFlightCount = self.inFlightCount + 1
  if msgType == 'ask' then self.asking, self.turtleMoves = messageId, 0 end
end

-- stopped, by the owner.
function Session:stop()
  if self.stopped then return end
  self.stopped = true
  self:endAttempt('daemon stopped')
  stopJobs(self)
  stopWatches(self)
  self:clearReconnect()
  for i = 1, #self.disposers do self.disposers[i]() end
  self.disposers = {}
  self.state = 'stopped'
  self:publish()
end

-- Which OS event calls which method.
local SESSION_EVENTS = {
  websocket_success = 'onOpen',
  websocket_failure = 'onFailure',
  websocket_closed = 'onClosed',
  websocket_message = 'onFrame',
  [M.EVENT_SEND] = 'forward',
  [M.EVENT_CAPABILITIES] = 'announceCapabilities',
  [M.EVENT_STOP] = 'onStopChange',
  redstone = 'onStopChange',
}

function Session:listen()
  for name, method in pairs(SESSION_EVENTS) do
    self.disposers[#self.disposers + 1] = self.loop.register(name, function(...)
      local ok, err = pcall(self[method], self, dropEventName(name, ...))
      if not ok then self.log(name .. ' handler failed: ' .. tostring(err)) end
    end)
  end
end

--[[ startSession(opts): the daemon. opts:
  url         gateway WebSocket URL (required), e.g. ws://host:4444/gateway
  secret      the shared password sent in hello (optional)
  http        table with websocketAsync(url, headers)     default _G.http
  eventLoop   register/setTimeout loop                     default _G.bootEventLoop or own loop
  encode, decode                                           default textutils JSON
  os          getComputerID/getComputerLabel/epoch/queueEvent  default _G.os
  random      function() -> [0,1)                          default math.random
  state       table to publish state into                  default _G.traposSandboxState
  log         function(message)                            default: none
  helloTimeout, connectTimeout, backoffMin, backoffMax, backoffJitter (seconds / fraction)
For the sandbox requests (SPEC §9), the CraftOS APIs they use (default: the globals):
  fs, term, settings (sandbox.allow), textutils (serialize, for eval),
  peripheral, turtle (SPEC §16; no turtle API: turtle requests answer unknown_type),
  redstone (the stop side's signal)
  shell       the shell exec runs programs with (the daemon's own; none: a plain loader)
  multishell  the multishell API eval code sees (the daemon's own; not a global on CC:Tweaked)
  clock       function() -> milliseconds              default os.epoch('utc')
  screen      function() -> the terminal exec and eval draw on   default _G.traposSandboxScreen
                (the shell's), else the daemon's own
  recorder    the readable screen (M.newRecorder), or false   default M.installRecorder(term)
Returns a session: isReady(), lastError(), state(), status(), stop(), loop (the event loop used). ]]
function M.startSession(opts)
  expect(1, opts, 'table')
  local baseUrl = expectNonEmpty(1, opts.url)
  field(opts, 'secret', 'string', 'nil')
  local httpApi = opts.http or http
  if type(httpApi) ~= 'table' or type(httpApi.websocketAsync) ~= 'function' then
    error('bad argument #1 (opts.http with websocketAsync expected)', 2)
  end
  local osLike = opts.os or os
  local published = opts.state
  if published == nil then
    published = rawget(_G, 'traposSandboxState') or {}
    rawset(_G, 'traposSandboxState', published)
  end

  local self = setmetatable({
    baseUrl = baseUrl,
    secret = opts.secret,
    headers = opts.headers,
    http = httpApi,
    os = osLike,
    loop = opts.eventLoop or rawget(_G, 'bootEventLoop') or M.createEventLoop(osLike),
    encode = opts.encode or defaultEncode,
    decode = opts.decode or defaultDecode,
    random = opts.random or math.random,
    log = opts.log or function() end,
    helloTimeout = opts.helloTimeout or M.HELLO_TIMEOUT,
    connectTimeout = opts.connectTimeout or M.CONNECT_TIMEOUT,
    backoffMin = opts.backoffMin or M.BACKOFF_MIN,
    backoffMax = opts.backoffMax or M.BACKOFF_MAX,
    backoffJitter = opts.backoffJitter or M.BACKOFF_JITTER,
    published = published,
    traposId = M.traposId(osLike),
    -- Starts every attempt's nonce: which websocket events are this session's (`owns`).
    tag = ('%.0f-%d'):format(osLike.epoch and osLike.epoch('utc') or 0,
      math.floor((opts.random or math.random)() * 1000000)),
    state = 'connecting',
    terminal = false,
    stopped = false,
    attempts = 0,
    failures = 0,
    current = nil, -- the attempt: { url, handle, done, helloId, ctx, clearHello, clearConnect }
    closedHandles = setmetatable({}, { __mode = 'k' }),
    inFlight = {},
    inFlightCount = 0,
    disposers = {},
    ownRequests = {},
    announced = nil,
    jobs = {},
    jobCount = 0,
    watches = {},
    watchCount = 0,
    fs = opts.fs or rawget(_G, 'fs'),
    term = opts.term or rawget(_G, 'term'),
    settings = opts.settings or rawget(_G, 'settings'),
    textutils = opts.textutils or rawget(_G, 'textutils'),
    peripheral = opts.peripheral or rawget(_G, 'peripheral'),
    turtle = opts.turtle or rawget(_G, 'turtle'),
    redstone = opts.redstone or rawget(_G, 'redstone'),
    halted = false,  -- the agent stopped (sandbox stop or the stop side's redstone), as last seen
    asking = nil,    -- the messageId of this computer's running ask (the turtle budget counts)
    turtleMoves = 0,
    shell = opts.shell,
    -- Like shell, not a global on CC:Tweaked: each program gets it in its environment.
    multishell = opts.multishell or rawget(_G, 'multishell'),
    clock = opts.clock or function() return osLike.epoch('utc') end,
    screen = opts.screen or function() return rawget(_G, 'traposSandboxScreen') end,
  }, Session)
  -- The screen, readable however the daemon was started (sandbox/screen).
  if opts.recorder ~= nil then
    self.recorder = opts.recorder or nil
  else
    self.recorder = M.installRecorder(self.term)
  end
  self:listen()
  self.halted = self:stopReason() ~= nil

  local session = { loop = self.loop, traposId = self.traposId }
  function session.isReady() return self.state == 'ready' end
  function session.lastError() return self.lastError end
  function session.state() return self.state end
  function session.currentUrl() return self.current and self.current.url or nil end
  function session.status()
    return {
      state = self.state, connected = self.state == 'ready', running = not self.stopped,
      traposId = self.traposId, url = baseUrl, lastError = self.lastError, accountId = self.accountId,
      version = _VERSION, attempts = self.attempts, capabilities = self:capabilities(),
      jobs = self.jobCount, watches = self.watchCount, agentStopped = self:stopReason() ~= nil,
    }
  end
  function session.stop() self:stop() end

  self:connect()
  return session
end
