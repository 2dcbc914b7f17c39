local _VERSION = '0.1.0'

-- libsandbox's module sandbox/api: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Entry points for programs ===================================================
-- Owns: what the sandbox command and other programs call: request (one request through the
-- daemon), ask (sandbox ask, streamed), newWrapper (word wrap for ask's output).
-- Needs: constants, encodings, envelopes. Exports: M.request, M.ask, M.newWrapper.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect
local expectNonEmpty = internal.expectNonEmpty

--[[ request(type, payload, opts) -> ok, payloadOrError
Queues trapos_sandbox_send and waits for the matching trapos_sandbox_reply or a timer.
opts: timeout (s, default 10), queueEvent, pullEvent, startTimer, cancelTimer, os. ]]
function M.request(msgType, payload, opts)
  expectNonEmpty(1, msgType)
  expect(2, payload, 'table', 'nil')
  expect(3, opts, 'table', 'nil')
  opts = opts or {}
  local osLike = opts.os or os
  local queueEvent = opts.queueEvent or osLike.queueEvent
  local pullEvent = opts.pullEvent or osLike.pullEvent
  local startTimer = opts.startTimer or osLike.startTimer
  local cancelTimer = opts.cancelTimer or osLike.cancelTimer
  local timeout = opts.timeout or M.REQUEST_TIMEOUT

  local messageId = M.newMessageId(osLike)
  local timer = startTimer(timeout)
  queueEvent(M.EVENT_SEND, messageId, msgType, M.coercePayload(payload))
  while true do
    local event, a, b, c, d = pullEvent()
    if event == M.EVENT_REPLY and a == messageId then
      if cancelTimer then pcall(cancelTimer, timer) end
      if b == true then return true, M.coercePayload(c) end
      return false, M.coerceError(d)
    elseif event == 'timer' and a == timer then
      return false, errorValue('timeout', ('no reply from the sandbox daemon within %s s'):format(tostring(timeout)))
    end
  end
end

--[[ newWrapper(width, write, newline, column) -> wrapper
Word-wraps streamed text to `width` columns: `write(s)` puts text on the current line (never
past the width), `newline()` starts the next one; `column` is where the cursor starts (0-based).
  wrapper.text(s)  add text; a word split across two calls is kept until it is complete
  wrapper.flush()  print a kept word
  wrapper.line(s)  s on a line of its own ]]
function M.newWrapper(width, write, newline, column)
  local w = { col = column or 0, pending = '', space = false }
  if width < 1 then width = 1 end
  local function nl() newline(); w.col = 0; w.space = false end
  local function put(word)
    if w.space then
      -- A space is written only in front of the word that follows it on the same line.
      w.space = false
      if w.col + 1 + #word <= width then write(' '); w.col = w.col + 1 else nl() end
    end
    while #word > 0 do
      if w.col > 0 and w.col + #word > width then nl() end
      if #word <= width - w.col then
        write(word); w.col = w.col + #word
        return
      end
      local room = width - w.col
      write(word:sub(1, room)); word = word:sub(room + 1); nl()
    end
  end
  function w.text(s)
    s = w.pending .. tostring(s)
    w.pending = ''
    local i, n = 1, #s
    while i <= n do
      local c = s:sub(i, i)
      if c == '\n' then
        nl(); i = i + 1
      elseif c == ' ' or c == '\t' or c == '\r' then
        if w.col > 0 then w.space = true end
        i = i + 1
      else
        local j = s:find('[ \t\r\n]', i)
        if not j then w.pending = s:sub(i); break end
        put(s:sub(i, j - 1)); i = j
      end
    end
    if #w.pending >= width then put(w.pending); w.pending = '' end
  end
  function w.flush()
    if w.pending ~= '' then put(w.pending); w.pending = '' end
  end
  function w.line(s)
    w.flush()
    if w.col > 0 then nl() end
    w.text(s); w.flush(); nl()
  end
  return w
end

local function shortTool(name)
  name = tostring(name or '?')
  return (name:gsub('^trapsandbox_', ''))
end

--[[ The agent's question (its question tool; partial {type = 'question', id, questions}):
each question with its options numbered. The player types a number (several, comma-separated,
when `multiple`), or an answer of their own when `custom`, then Enter; an empty line rejects
the question. newQuestion(p, line, echo) shows the first; its :key(event, a) takes the `char`,
`paste` and `key` events and returns, once every question has its answer, the ask_answer payload. ]]
local function newQuestion(p, line, echo)
  local q = { id = p.id, questions = p.questions, index = 1, answers = {}, typed = '' }
  function q.show()
    local it = q.questions[q.index]
    line('? ' .. tostring(it.question))
    for i, option in ipairs(type(it.options) == 'table' and it.options or {}) do
      local about = option.description and option.description ~= '' and (' - ' .. tostring(option.description)) or ''
      line(('  %d. %s%s'):format(i, tostring(option.label), about))
    end
    line(it.multiple and 'Numbers, comma-separated' .. (it.custom and ', or your answer' or '') .. ' (empty: refuse):'
      or 'A number' .. (it.custom and ' or your answer' or '') .. ' (empty: refuse):')
  end
  local function picked(it, text)
    local options, labels = type(it.options) == 'table' and it.options or {}, {}
    for word in (text .. ','):gmatch('([^,]*),') do
      local n = tonumber((word:gsub('^%s+', ''):gsub('%s+$', '')))
      if not n or not options[n] then return nil end
      labels[#labels + 1] = tostring(options[n].label)
    end
    if #labels > 1 and not it.multiple then return nil end
    return labels
  end
  function q:key(event, a)
    if event == 'char' or event == 'paste' then
      self.typed = self.typed .. tostring(a)
      echo(a)
      return nil
    end
    local k = keys or {}
    if event ~= 'key' or (a ~= k.enter and a ~= k.numPadEnter) then
      if event == 'key' and a == k.backspace and #self.typed > 0 then
        self.typed = self.typed:sub(1, -2)
        echo(nil)
      end
      return nil
    end
    local text = self.typed
    self.typed = ''
    line('')
    if text:match('^%s*$') then return { questionId = self.id, reject = true } end
    local it = self.questions[self.index]
    local answer = picked(it, text) or (it.custom and { text }) or nil
    if not answer then
      line(('Type a number from 1 to %d.'):format(#(it.options or {})))
      return nil
    end
    self.answers[self.index] = answer
    self.index = self.index + 1
    if self.questions[self.index] then self.show() return nil end
    return { questionId = self.id, answers = self.answers }
  end
  q.show()
  return q
end

-- What a waiting ask shows: how many asks are ahead of it in the gateway's queue.
local function waitingLine(ahead)
  if ahead < 1 then return 'waiting for the agent: next in line' end
  return ('waiting for the agent: %d ask%s ahead'):format(ahead, ahead == 1 and '' or 's')
end

--[[ ask(prompt, opts) -> ok, payloadOrError
`sandbox ask`: sends computer_request ask {prompt, new?, yes?} through the daemon and prints
its partials as they arrive: text word-wrapped through opts.out (a newWrapper), one line per
tool the agent uses, a line while it waits its turn (and again when its place changes), a y/a/n question per permission request (answered with ask_permission),
the agent's questions with numbered options (newQuestion, answered with ask_answer).
`terminate` (Ctrl+T) sends cancel {messageId} and waits for the final answer a while; a second
one gives up at once. Every partial restarts the idle timer, so a long answer never times out.
opts: new, yes, out, print, pullEvent (raw: it must return terminate), queueEvent, startTimer,
cancelTimer, os, timeout. ]]
function M.ask(prompt, opts)
  expectNonEmpty(1, prompt)
  opts = opts or {}
  local osLike = opts.os or os
  local queueEvent = opts.queueEvent or osLike.queueEvent
  local pullEvent = opts.pullEvent or osLike.pullEventRaw
  local startTimer = opts.startTimer or osLike.startTimer
  local cancelTimer = opts.cancelTimer or osLike.cancelTimer
  local say = opts.print or print
  local out = opts.out
  local timeout = opts.timeout or M.ASK_IDLE_TIMEOUT

  local messageId = M.newMessageId(osLike)
  local timer = startTimer(timeout)
  local function restart(seconds)
    if cancelTimer then pcall(cancelTimer, timer) end
    timer = startTimer(seconds)
  end
  local function line(text)
    if out then out.line(text) else say(text) end
  end
  queueEvent(M.EVENT_SEND, messageId, 'ask', { prompt = prompt, new = opts.new == true, yes = opts.yes == true })
  local asking, cancelled, printed, question, waited = nil, false, false, nil, nil
  local function echo(typed)
    if typed then
      write(typed) -- as typed, not through the word-wrapper, which holds back a word's start
    elseif term and term.getCursorPos then -- backspace: one column back, blanked
      local x, y = term.getCursorPos()
      if x > 1 then term.setCursorPos(x - 1, y) term.write(' ') term.setCursorPos(x - 1, y) end
    end
  end
  while true do
    local event, a, b, c, d = pullEvent()
    if event == M.EVENT_PARTIAL and a == messageId then
      if not cancelled then restart(timeout) end
      local p = type(b) == 'table' and b or {}
      if p.type == 'text_delta' and type(p.text) == 'string' then
        printed = true
        if out then out.text(p.text) else write(p.text) end
      elseif p.type == 'tool' then
        if p.status == 'running' then
          line('[' .. shortTool(p.name) .. ']')
        elseif p.status == 'error' then
          line('[' .. shortTool(p.name) .. ' failed' .. (p.error and (': ' .. tostring(p.error)) or '') .. ']')
        end
      elseif p.type == 'permission' and type(p.id) == 'string' then
        line('Allow ' .. shortTool(p.tool) .. ': ' .. tostring(p.detail or '') .. '?')
        line('[y] once  [a] always  [n] no')
        asking = p.id
      elseif p.type == 'waiting' and type(p.ahead) == 'number' then
        -- Its turn has not come (the gateway's queue); told again unchanged now and then.
        if p.ahead ~= waited then
          waited = p.ahead
          line(waitingLine(p.ahead))
        end
      elseif p.type == 'question' and type(p.id) == 'string' and type(p.questions) == 'table'
          and p.questions[1] then
        if out then out.flush() end
        question = newQuestion(p, line, echo)
      end
    elseif event == M.EVENT_REPLY and a == messageId then
      if cancelTimer then pcall(cancelTimer, timer) end
      if b ~= true then
        if out then out.flush() end
        return false, M.coerceError(d)
      end
      local answer = M.coercePayload(c)
      -- Nothing streamed (events lost on the way): the final answer has the whole text.
      if not printed and type(answer.text) == 'string' and answer.text ~= '' then
        if out then out.text(answer.text) else write(answer.text) end
      end
      if out then out.flush() end
      return true, answer
    elseif event == 'char' and asking then
      local response = ({ y = 'once', a = 'always', n = 'reject' })[string.lower(tostring(a))]
      if response then
        queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'ask_permission',
          { permissionId = asking, response = response })
        line(response == 'reject' and '> refused' or ('> allowed (' .. response .. ')'))
        asking = nil
      end
    elseif (event == 'char' or event == 'paste' or event == 'key') and question then
      local answered = question:key(event, a)
      if answered then
        queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'ask_answer', answered)
        line(answered.reject and '> refused' or '> answered')
        question = nil
      end
    elseif event == 'terminate' then
      if cancelled then
        if out then out.flush() end
        return false, errorValue('cancelled', 'stopped waiting for the agent')
      end
      cancelled, asking, question = true, nil, nil
      queueEvent(M.EVENT_SEND, M.newMessageId(osLike), 'cancel', { messageId = messageId })
      line('Cancelling the agent...')
      restart(M.ASK_CANCEL_WAIT)
    elseif event == 'timer' and a == timer then
      if out then out.flush() end
      if cancelled then return false, errorValue('cancelled', 'the agent was cancelled') end
      return false, errorValue('timeout', ('no word from the agent for %s s'):format(tostring(timeout)))
    end
  end
end
