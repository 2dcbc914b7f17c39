// The agent panel (issue 34): the signed-in player asks the agent about the selected computer
// and reads its answer as it streams in: its text, each tool it calls (which, with what, how it
// ended), its permission requests and questions answered here, a Stop button. It is the
// computer's own conversation, the one `sandbox ask` continues in the game: the gateway keys it
// by the computer (web/agentcalls.py), and one ask runs on a computer at a time, whoever
// started it. When the run changed files, the snapshot taken before its first change is named
// and an Undo button restores it (snapshot_restore).
//
// Requests go over the computers' socket (operator.js, operatorRequest) as the /operator types
// ask (its partials streamed), ask_cancel, ask_permission, ask_answer. What the agent wrote
// and what its tools did are set as text, never as HTML.

import { $, connectedNow, failure, has, keyOf, operatorRequest, state } from "./operator.js";

const agent = {
  key: null,        // the computer shown (keyOf)
  run: null,        // the ask running from this page: {key, name, id, turn}
};
const TOOL_PREFIX = "trapsandbox_";
const PERMISSION_REPLIES = [["once", "Allow once"], ["always", "Always allow"], ["reject", "Reject"]];

function agentError(text) { $("agent-error").textContent = text || ""; }
function agentShown(computer) { return agent.key === keyOf(computer); }
function running() { return Boolean(agent.run); }

export function setUpAgent() {
  $("agent-form").addEventListener("submit", (event) => { event.preventDefault(); sendAsk(); });
  $("agent-prompt").addEventListener("keydown", (event) => {
    // Enter asks, Shift+Enter is a new line (as in chat boxes).
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); sendAsk(); }
  });
  $("agent-stop").addEventListener("click", stopAsk);
}

export function showAgent(computer) {
  agent.key = keyOf(computer);
  $("agent-area").hidden = false;
  $("agent-title").textContent = "Agent on " + computer.traposId;
  $("agent-log").replaceChildren();
  agentError("");
  if (agent.run && agent.run.key === agent.key) {
    // Shown again while its ask runs: what comes next is shown under its prompt again.
    const turn = agent.run.turn;
    turn.text = null;
    turn.tools = null;
    logItem("prompt").textContent = turn.prompt;
  }
  agentAllowed();
}

// What the computer allows decides what the agent can do there, not whether it can be asked:
// said in the notice. Called on every change of the computers' list.
export function agentAllowed() {
  if (!state.selected || agent.key !== keyOf(state.selected)) return;
  const computer = state.selected;
  const name = computer.traposId;
  let why = "";
  if (!connectedNow()) why = "Computer " + name + " is not connected: the agent cannot be asked about it.";
  else if (computer.stopped) why = "Stopped by its player: the agent is refused until \"sandbox resume\" on " + name + ".";
  else if (computer.capabilities.length === 0) why = "The agent can answer but not act: " + name + " has allowed nothing (on it, run \"sandbox allow exec\", \"sandbox allow fs.read\", …).";
  else if (!computer.capabilities.includes("fs.read")) why = "No snapshot before the agent's changes: " + name + " has not allowed fs.read, so its changes cannot be undone here.";
  $("agent-notice").textContent = why;
  const mine = running() && agent.run.key === agent.key;
  $("agent-send").disabled = running() || !connectedNow() || Boolean(computer.stopped);
  $("agent-stop").disabled = !mine;
  $("agent-state").textContent = mine ? "the agent is working…" : running() ? "an ask runs on " + agent.run.name : "";
}

// -- One turn: the prompt, then what the agent does --------------------------------------------

function logItem(className) {
  const item = document.createElement("li");
  item.className = className;
  $("agent-log").append(item);
  item.scrollIntoView({ block: "nearest" });
  return item;
}

function newTurn(prompt) {
  const asked = logItem("prompt");
  asked.textContent = prompt;
  return { prompt, text: null, tools: null };
}

// The agent's words, appended to its current paragraph (a tool call starts a new one).
function addText(turn, text) {
  if (!turn.text) turn.text = logItem("text");
  turn.text.textContent += text;
}

function toolName(name) { return name.startsWith(TOOL_PREFIX) ? name.slice(TOOL_PREFIX.length) : name; }

function addTool(turn, partial) {
  turn.text = null;
  const calls = turn.tools || (turn.tools = new Map());
  // One line per call, named by its callID: a call's later statuses update it, and two calls
  // of one tool at once are two lines.  (Without a callID: the last unfinished line of the tool.)
  const key = partial.callID || partial.name;
  let line = calls.get(key);
  if (!line || line.dataset.status === "completed" || line.dataset.status === "error") {
    line = logItem("tool");
    calls.set(key, line);
  }
  line.dataset.status = partial.status;
  line.replaceChildren();
  const name = document.createElement("code");
  name.textContent = toolName(partial.name);
  const status = document.createElement("span");
  status.className = "status";
  status.textContent = partial.status;
  line.append("tool ", name, " ");
  if (partial.detail && partial.name !== "question") {  // (a question is shown as one)
    const detail = document.createElement("code");
    detail.className = "detail";
    detail.textContent = partial.detail;
    line.append(detail, " ");
  }
  line.append(status);
  if (partial.error) line.append(": " + partial.error);
}

function addPermission(computer, turn, partial) {
  turn.text = null;
  const box = logItem("permission");
  box.setAttribute("role", "group");
  const said = document.createElement("p");
  said.textContent = "Allow " + toolName(partial.tool) + ": " + partial.detail + "?";
  box.append(said);
  for (const [response, label] of PERMISSION_REPLIES) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.dataset.response = response;
    if (response === "reject") button.className = "danger";
    button.addEventListener("click", async () => {
      for (const b of box.querySelectorAll("button")) b.disabled = true;
      const answer = await operatorRequest(computer, "ask_permission", { permissionId: partial.id, response });
      said.textContent += answer.ok ? " " + label + "." : " (not sent: " + failure(answer) + ")";
      if (answer.ok) for (const b of box.querySelectorAll("button")) b.remove();
    });
    box.append(button);
  }
  box.querySelector("button").focus();
}

// The agent's question (opencode's question tool): each question's options as choices, and a
// text field when it takes an answer of the player's own.
function addQuestion(computer, turn, partial) {
  turn.text = null;
  const form = document.createElement("form");
  form.className = "question";
  const fields = partial.questions.map((q, n) => {
    const set = document.createElement("fieldset");
    const legend = document.createElement("legend");
    legend.textContent = q.question;
    set.append(legend);
    const kind = q.multiple ? "checkbox" : "radio";
    const choices = q.options.map((option) => {
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = kind;
      input.name = partial.id + "-" + n;
      input.value = option.label;
      label.append(input, " " + option.label + (option.description ? " — " + option.description : ""));
      set.append(label);
      return input;
    });
    let own = null;
    if (q.custom) {
      own = document.createElement("input");
      own.type = "text";
      own.placeholder = "or type an answer";
      own.setAttribute("aria-label", "Your own answer to: " + q.question);
      set.append(own);
    }
    form.append(set);
    return { choices, own };
  });
  const send = document.createElement("button");
  send.type = "submit";
  send.textContent = "Answer";
  const reject = document.createElement("button");
  reject.type = "button";
  reject.textContent = "Don't answer";
  form.append(send, " ", reject);
  const item = logItem("question-item");
  item.append(form);
  const reply = async (payload, said) => {
    for (const element of form.elements) element.disabled = true;
    const answer = await operatorRequest(computer, "ask_answer", { questionId: partial.id, ...payload });
    const result = document.createElement("p");
    result.textContent = answer.ok ? said : "Not sent: " + failure(answer);
    item.append(result);
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const answers = fields.map(({ choices, own }) => {
      const picked = choices.filter((c) => c.checked).map((c) => c.value);
      if (own && own.value.trim()) picked.push(own.value.trim());
      return picked;
    });
    if (answers.some((a) => a.length === 0)) { agentError("Answer each question (or choose \"Don't answer\")."); return; }
    agentError("");
    reply({ answers }, "Answered: " + answers.map((a) => a.join(", ")).join("; ") + ".");
  });
  reject.addEventListener("click", () => reply({ reject: true }, "Not answered."));
  const first = form.querySelector("input");
  if (first) first.focus();
}

function onPartial(computer, turn, partial) {
  if (!agentShown(computer)) return;
  if (partial.type === "text_delta") addText(turn, partial.text);
  else if (partial.type === "tool") addTool(turn, partial);
  else if (partial.type === "permission") addPermission(computer, turn, partial);
  else if (partial.type === "question") addQuestion(computer, turn, partial);
  else if (partial.type === "waiting") $("agent-state").textContent = "waiting for the agent: " + partial.ahead + " asks ahead";
}

async function sendAsk() {
  const computer = state.selected;
  const prompt = $("agent-prompt").value.trim();
  if (!computer || running() || !prompt) return;
  agentError("");
  const fresh = $("agent-new").checked;
  $("agent-prompt").value = "";
  $("agent-new").checked = false;
  const turn = newTurn(prompt);
  agent.run = { key: keyOf(computer), name: computer.traposId, id: null, turn };
  agentAllowed();
  const payload = { prompt };
  if (fresh) payload.new = true;
  const answer = await operatorRequest(
    computer, "ask", payload, (partial) => onPartial(computer, turn, partial),
    (id) => { if (agent.run) agent.run.id = id; },
  );
  agent.run = null;
  if (agentShown(computer)) {
    ended(computer, turn, answer);
    agentAllowed();
  }
}

function ended(computer, turn, answer) {
  const item = logItem("end");
  if (!answer.ok) {
    const code = answer.error && answer.error.code;
    item.classList.add(code === "cancelled" ? "stopped" : "failed");
    item.textContent = code === "cancelled" ? "Stopped: " + failure(answer) : "The ask failed: " + failure(answer);
    return;
  }
  const done = answer.payload;
  if (!turn.text && done.text && !turn.tools) addText(turn, done.text);  // (no partials seen)
  if (!done.changed) { item.textContent = "Done."; return; }
  item.classList.add("changed");
  item.append("Done: " + done.changed + " file" + (done.changed === 1 ? "" : "s") + " changed");
  if (done.snapshot) {
    item.append(" since snapshot " + done.snapshot + ", taken before the agent's first change. ");
    undoButton(computer, item, done.snapshot);
  } else {
    item.append(".");
  }
}

// Undo: restore the snapshot taken before the run's first change, after a confirmation.
function undoButton(computer, item, snapshot) {
  const undo = document.createElement("button");
  undo.type = "button";
  undo.className = "undo";
  undo.textContent = "Undo…";
  const confirm = document.createElement("span");
  confirm.className = "confirm-inline";
  confirm.hidden = true;
  const yes = document.createElement("button");
  yes.type = "button";
  yes.className = "danger";
  yes.textContent = "Restore snapshot " + snapshot;
  const no = document.createElement("button");
  no.type = "button";
  no.textContent = "Cancel";
  confirm.append("Bring the files back to snapshot " + snapshot + "? ", yes, " ", no);
  const result = document.createElement("p");
  result.className = "restored";
  undo.addEventListener("click", () => { confirm.hidden = false; no.focus(); });
  no.addEventListener("click", () => { confirm.hidden = true; undo.focus(); });
  yes.addEventListener("click", async () => {
    confirm.hidden = true;
    undo.disabled = true;
    result.textContent = "restoring snapshot " + snapshot + "…";
    const answer = await operatorRequest(computer, "snapshot_restore", { snapshot });
    if (!answer.ok) {
      undo.disabled = false;
      result.textContent = "Not undone: " + failure(answer);
      return;
    }
    const p = answer.payload;
    result.textContent = "Undone: restored snapshot " + p.restored + " (" + p.written.length + " written, "
      + p.deleted.length + " deleted). The files as they were are snapshot " + p.before + ".";
  });
  item.append(undo, confirm, result);
  if (!has("fs.write")) {
    undo.disabled = true;
    undo.title = "Undo needs fs.write (on " + computer.traposId + ", run \"sandbox allow fs.write\")";
  }
}

async function stopAsk() {
  const run = agent.run;
  if (!run || !run.id || run.key !== agent.key) return;
  $("agent-stop").disabled = true;
  $("agent-state").textContent = "stopping…";
  const computer = state.computers.find((c) => keyOf(c) === run.key) || state.selected;
  const answer = await operatorRequest(computer, "ask_cancel", { ask: run.id });
  if (!answer.ok) agentError("Not stopped: " + failure(answer));
}
