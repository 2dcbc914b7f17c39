// The trapsandbox web console (SPEC §14): plain JavaScript, no build step.
//
// Two /operator WebSockets per tab, each opened with the token as its first
// message (never in a URL): one watches the computers (watch_computers), the
// other the selected computer's screen (screen_watch) and carries its input;
// choosing another computer closes the second, which ends its watch.
"use strict";

const TOKEN_KEY = "trapsandbox.token";
// CraftOS's default palette, blit digit order (0 white .. f black).
const DEFAULT_PALETTE = [
  "#f0f0f0", "#f2b233", "#e57fd8", "#99b2f2", "#dede6c", "#7fcc19", "#f2b2cc", "#4c4c4c",
  "#999999", "#4c99b2", "#b266e5", "#3366cc", "#7f664c", "#57a64e", "#cc4c4c", "#111111",
];
// Browser key names (KeyboardEvent.key) -> CraftOS key names.
const KEYS = {
  Enter: "enter", Backspace: "backspace", Tab: "tab", Delete: "delete", Escape: "escape",
  ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right",
  Home: "home", End: "end", PageUp: "pageUp", PageDown: "pageDown", Insert: "insert",
  F1: "f1", F2: "f2", F3: "f3", F4: "f4", F5: "f5", F6: "f6", F7: "f7", F8: "f8",
  F9: "f9", F10: "f10", F11: "f11", F12: "f12",
};

const $ = (id) => document.getElementById(id);
const state = { computers: [], selected: null, list: null, watch: null, nextId: 1, rows: [] };

function say(text) { $("status").textContent = text; }
function notice(text) { $("notice").textContent = text || ""; }
function keyOf(c) { return c.accountId + "\u0000" + c.traposId; }

// An /operator socket: the token first; `onReady` once authenticated, `onMessage` after.
function operatorSocket(onReady, onMessage, onEnd) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(scheme + "//" + location.host + "/operator");
  let ready = false;
  ws.onopen = () => ws.send(JSON.stringify({ token: sessionStorage.getItem(TOKEN_KEY) || "" }));
  ws.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (!ready && message.authenticated) { ready = true; onReady(ws, message); return; }
    onMessage(message);
  };
  ws.onclose = (event) => onEnd(event, ready);
  return ws;
}

function connect() {
  if (state.list) { state.list.onclose = null; state.list.close(); }
  say("connecting…");
  state.list = operatorSocket(
    (ws, message) => {
      say(message.account ? "signed in: account " + message.account : "signed in: admin");
      ws.send(JSON.stringify({ id: "computers", type: "watch_computers" }));
    },
    (message) => {
      if (message.id === "computers" && message.partial) showComputers(message.payload.computers);
    },
    (event, ready) => {
      say(ready ? "disconnected from the gateway" : "refused: " + (event.reason || "cannot connect"));
      showComputers([]);
    },
  );
}

function showComputers(computers) {
  state.computers = computers;
  const list = $("computers");
  list.replaceChildren();
  for (const c of computers) {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.trapos = c.traposId;
    button.textContent = c.traposId;
    const caps = document.createElement("span");
    caps.className = "caps";
    caps.textContent = c.accountId + " · " + (c.capabilities.join(", ") || "nothing allowed");
    button.append(caps);
    if (c.stopped) {
      // The player's brake (sandbox stop, SPEC §16): nothing reaches the computer until resume.
      const badge = document.createElement("span");
      badge.className = "stopped";
      badge.textContent = "stopped";
      badge.title = c.stopMessage || "";
      button.append(badge);
    }
    if (state.selected && keyOf(state.selected) === keyOf(c)) button.setAttribute("aria-current", "true");
    button.addEventListener("click", () => select(c));
    item.append(button);
    list.append(item);
  }
  $("no-computers").hidden = computers.length > 0;
  if (state.selected) {
    const now = computers.find((c) => keyOf(c) === keyOf(state.selected));
    if (!now) {
      disconnected();
    } else {
      const resumed = state.selected.stopped && !now.stopped;
      state.selected = now;
      $("screen").classList.toggle("halted", Boolean(now.stopped));
      inputNotice();
      // Stopping ended the screen watch on the computer: after resume, watch again.
      if (resumed && state.watch) { state.watch.onclose = null; state.watch.close(); state.watch = null; }
      watchScreen();
    }
  }
}

function disconnected() {
  $("screen").classList.add("gone");
  notice("Computer " + state.selected.traposId + " disconnected: its last screen is shown.");
  if (state.watch) { state.watch.onclose = null; state.watch.close(); state.watch = null; }
}

function canType() {
  return state.selected && !state.selected.stopped && state.selected.capabilities.includes("input");
}

function inputNotice() {
  if (!state.selected) return;
  if (state.selected.stopped) {
    // The computer cannot tell the agent from an operator: its stop refuses both.
    notice("Stopped by its player: " + (state.selected.stopMessage || "run \"sandbox resume\" on it")
      + ". Nothing reaches it until then: screen, typing and requests are refused.");
  } else if (!state.selected.capabilities.includes("screen")) {
    notice("Read-only: " + state.selected.traposId + " has not allowed screen (on it, run \"sandbox allow screen\").");
  } else if (!canType()) {
    notice("Read-only: " + state.selected.traposId + " has not allowed input (on it, run \"sandbox allow input\").");
  } else {
    notice("");
  }
}

function select(computer) {
  state.selected = computer;
  if (state.watch) { state.watch.onclose = null; state.watch.close(); }
  state.watch = null;
  state.rows = [];
  $("activity").replaceChildren();
  const screen = $("screen");
  screen.replaceChildren();
  screen.classList.remove("gone");
  screen.classList.toggle("halted", Boolean(computer.stopped));
  screen.setAttribute("aria-label", "Terminal of computer " + computer.traposId);
  $("terminal-title").textContent = "Computer " + computer.traposId;
  showComputers(state.computers);
  inputNotice();
  watchScreen();
}

// The selected computer's screen_watch, on a socket of its own (closing it ends the watch);
// none while the computer has not allowed screen (the notice says why).
function watchScreen() {
  const computer = state.selected;
  if (state.watch || !computer.capabilities.includes("screen")) return;
  const screen = $("screen");
  state.watch = operatorSocket(
    (ws) => {
      ws.send(JSON.stringify({
        id: "screen", traposId: computer.traposId, account: computer.accountId,
        type: "screen_watch", payload: { maxFps: 20 },
      }));
      ws.send(JSON.stringify({
        id: "activity", traposId: computer.traposId, account: computer.accountId,
        type: "watch_activity",
      }));
      screen.focus();
    },
    (message) => {
      if (message.id === "screen" && message.partial) draw(message.payload);
      else if (message.id === "activity" && message.partial) showActivity(message.payload.activity);
      else if (message.id === "screen" && keyOf(state.selected) === keyOf(computer) && message.status !== 200) {
        notice("The screen cannot be watched: " + ((message.error && message.error.message) || message.status));
      } else if (String(message.id).startsWith("input-") && !message.ok) {
        notice("Typing was refused: " + ((message.error && message.error.message) || message.status));
      }
    },
    () => {},
  );
}

// Each request sent to the computer (anyone's), newest first, with who sent it, updated as it
// runs (an ask: the agent's text as it arrives, its tools, its questions) and when it ends.
// Typing (input) and the console's own screen watch are left out: they would drown the rest.
function whoSent(entry) {
  const by = entry.by === "player" ? "the player" : entry.by === "ask" ? "the agent (ask)" : entry.by;
  return by ? " — " + by + (entry.account ? " (" + entry.account + ")" : "") : "";
}

function showActivity(entry) {
  if (entry.type === "input" || entry.type === "screen_watch") return;
  const list = $("activity");
  let item = list.querySelector('[data-n="' + entry.n + '"]');
  if (!item) {
    item = document.createElement("li");
    item.dataset.n = String(entry.n);
    const what = document.createElement("span");
    what.textContent = entry.type + (entry.detail ? " " + entry.detail : "");
    const outcome = document.createElement("span");
    outcome.className = "state";
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = whoSent(entry);
    item.append(what, " ", outcome, who);
    list.prepend(item);
    while (list.children.length > 50) list.lastChild.remove();
  }
  if (entry.state === "running") {
    showProgress(item, entry);
    return;
  }
  const ended = entry.state !== "started";
  item.classList.toggle("failed", ended && entry.state !== "ok");
  item.querySelector(".state").textContent = ended
    ? "· " + entry.state + " · " + entry.durationMs + " ms" : "· running…";
}

// How an ask goes: its text grows in one paragraph (the last 4000 characters kept); each tool,
// permission asked and question is a line of its own.
function showProgress(item, entry) {
  if (typeof entry.text === "string") {
    let text = item.querySelector(".text");
    if (!text) {
      text = document.createElement("p");
      text.className = "text";
      item.append(text);
    }
    text.textContent = (text.textContent + entry.text).slice(-4000);
    return;
  }
  let line = null;
  if (entry.tool) line = "tool " + entry.tool + " · " + entry.status;
  else if (entry.permission) line = "asks to use " + entry.permission + (entry.detail ? ": " + entry.detail : "");
  else if (entry.question) line = "asks: " + entry.question;
  if (line === null) return;
  const note = document.createElement("p");
  note.className = "step";
  note.textContent = line;
  item.append(note);
  const said = item.querySelector(".text");
  if (said) said.className = "said";  // text after a step starts a new paragraph
}

function setPalette(palette) {
  const screen = $("screen");
  palette.forEach((colour, i) => screen.style.setProperty("--c" + i, colour));
}

// One row as spans of runs of the same colours; the cursor's cell its own span.
function drawRow(y, row, frame) {
  const line = document.createElement("span");
  line.className = "row";
  const cursorAt = frame.cursorBlink && frame.cursorY === y ? frame.cursorX - 1 : -1;
  let start = 0;
  for (let x = 1; x <= row.line.length; x++) {
    const cut = x === row.line.length || x === cursorAt || x - 1 === cursorAt
      || row.text[x] !== row.text[start] || row.background[x] !== row.background[start];
    if (!cut) continue;
    const span = document.createElement("span");
    span.className = "f" + row.text[start] + " b" + row.background[start];
    if (start === cursorAt) span.classList.add("cursor");
    span.textContent = row.line.slice(start, x);
    line.append(span);
    start = x;
  }
  return line;
}

function draw(frame) {
  const screen = $("screen");
  if (frame.palette) setPalette(frame.palette);
  const previousCursor = state.cursorY;
  for (const [y, row] of Object.entries(frame.rows)) state.rows[Number(y)] = row;
  state.cursorY = frame.cursorY;
  screen.classList.toggle("blink", frame.cursorBlink);
  while (screen.children.length > frame.height) screen.lastChild.remove();
  for (let y = 1; y <= frame.height; y++) {
    const row = state.rows[y] || { line: " ".repeat(frame.width), text: "0".repeat(frame.width), background: "f".repeat(frame.width) };
    const changed = y in frame.rows || y === frame.cursorY || y === previousCursor;
    const old = screen.children[y - 1];
    if (old && !changed) continue;
    const line = drawRow(y, row, frame);
    if (old) old.replaceWith(line); else screen.append(line);
  }
}

function sendEvents(events) {
  if (!state.watch || state.watch.readyState !== WebSocket.OPEN || !canType()) return;
  state.watch.send(JSON.stringify({
    id: "input-" + state.nextId++, traposId: state.selected.traposId,
    account: state.selected.accountId, type: "input", payload: { events },
  }));
}

function onKey(event) {
  if (!state.selected || !canType()) return;
  if (event.ctrlKey && event.key.toLowerCase() === "t") {
    sendEvents([{ terminate: true }]);
  } else if (KEYS[event.key]) {
    sendEvents([{ key: KEYS[event.key] }]);
  } else if (event.key.length === 1 && !event.ctrlKey && !event.metaKey && !event.altKey) {
    sendEvents([{ char: event.key }]);
  } else {
    return;
  }
  event.preventDefault();
}

function onPaste(event) {
  const text = event.clipboardData && event.clipboardData.getData("text");
  if (text && canType()) { sendEvents([{ paste: text.slice(0, 512) }]); event.preventDefault(); }
}

document.addEventListener("DOMContentLoaded", () => {
  setPalette(DEFAULT_PALETTE);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    connect();
  });
  $("screen").addEventListener("keydown", onKey);
  $("screen").addEventListener("paste", onPaste);
  if (saved !== null) connect();
});
