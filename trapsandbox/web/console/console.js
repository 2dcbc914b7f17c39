// The trapsandbox web console (SPEC §14): plain JavaScript, native ES modules, no build step
// (but the editor's bundle, editor.js). This is the page's module: the computers' list, the
// selected computer's screen and activity, its snapshots (the "Snapshots" section at the end of
// this file); it sets up the files panel (files.js, transfer.js) and the agent panel (agent.js).
// What they all share, the page's state and the /operator requests, is operator.js.
//
// Two /operator WebSockets per tab, each opened with the token as its first
// message (never in a URL): one watches the computers (watch_computers), the
// other the selected computer's screen (screen_watch) and carries its input;
// choosing another computer closes the second, which ends its watch.
// The first also carries the selected computer's snapshot requests (SPEC §15), its files
// panel's and its agent panel's, each an operatorRequest answered by its id.

import {
  $, REQUEST_ID, TOKEN_KEY, bytes, connectedNow, failure, has, keyOf, operatorRequest,
  operatorSocket, requestAnswered, requestsSocketEnded, state,
} from "./operator.js";
import { agentAllowed, setUpAgent, showAgent } from "./agent.js";
import { filesAllowed, setUpFiles, showFiles } from "./files.js";

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

function say(text) { $("status").textContent = text; }
function notice(text) { $("notice").textContent = text || ""; }

function connect() {
  if (state.list) { state.list.onclose = null; state.list.close(); requestsSocketEnded(); }
  say("connecting…");
  state.list = operatorSocket(
    (ws, message) => {
      say(message.account ? "signed in: account " + message.account : "signed in: admin");
      ws.send(JSON.stringify({ id: "computers", type: "watch_computers" }));
    },
    (message) => {
      if (message.id === "computers" && message.partial) showComputers(message.payload.computers);
      else if (String(message.id).startsWith(REQUEST_ID)) requestAnswered(message);
    },
    (event, ready) => {
      say(ready ? "disconnected from the gateway" : "refused: " + (event.reason || "cannot connect"));
      requestsSocketEnded();
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
      state.selected = now;
      $("screen").classList.toggle("halted", Boolean(now.stopped));
      inputNotice();
      // A watch the computer ended (a stop, its limit of watches) is tried again on its
      // next change (a resume, say).
      if (state.screenEnded && state.watch) { state.watch.onclose = null; state.watch.close(); state.watch = null; }
      watchScreen();
    }
  }
  snapshotsAllowed();
  filesAllowed();
  agentAllowed();
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
  showSnapshots(computer);
  showFiles(computer);
  showAgent(computer);
  showComputers(state.computers);
  inputNotice();
  watchScreen();
}

// The selected computer's screen_watch, on a socket of its own (closing it ends the watch);
// none while the computer has not allowed screen (the notice says why).
function watchScreen() {
  const computer = state.selected;
  if (state.watch || computer.stopped || !computer.capabilities.includes("screen")) return;
  state.screenEnded = false;
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
      else if (message.id === "screen" && keyOf(state.selected) === keyOf(computer)) {
        state.screenEnded = true;
        if (message.status !== 200 && !state.selected.stopped) {  // (a stop says so itself)
          notice("The screen cannot be watched: " + ((message.error && message.error.message) || message.status));
        }
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
  if (ended) snapshotsMayHaveChanged(entry);
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
  setUpSnapshots();
  setUpFiles();
  setUpAgent();
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

// -- Snapshots (SPEC §15) ---------------------------------------------------------------------
// The selected computer's snapshots, newest first; one selected shows its changes against the
// computer now (paths with sizes, and the gateway's bounded unified diff of each modified text
// file), and restores it after an inline confirmation.  Requests go over the computers' socket
// (state.list) as the /operator types snapshots, snapshot_take, snapshot_changes and
// snapshot_restore.  Everything the computer wrote (paths, diffs) is set as text, never as HTML.

const SHOWN_CHANGES = 500;  // paths listed per kind; the rest are counted
const REASONS = {
  ask: "before the agent's ask",
  manual: "taken by an operator",
  restore: "before a restore",
};
const snaps = { key: null, list: [], selected: null, busy: false };
const snapshotRequest = operatorRequest;

// Whether the answer is still about the computer shown (another may have been selected since).
function stillShown(computer) { return snaps.key === keyOf(computer); }

function snapshotError(text) { $("snapshots-error").textContent = text || ""; }
function snapshotStatus(text) { $("snapshots-status").textContent = text || ""; }

function setUpSnapshots() {
  $("take-snapshot").addEventListener("click", takeSnapshot);
  $("restore").addEventListener("click", askRestore);
  $("restore-no").addEventListener("click", () => closeRestore(true));
  $("restore-yes").addEventListener("click", restoreSnapshot);
  $("restore-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") { event.preventDefault(); closeRestore(true); }
  });
}

function showSnapshots(computer) {
  snaps.key = keyOf(computer);
  snaps.list = [];
  snaps.selected = null;
  snaps.busy = false;
  $("snapshots-area").hidden = false;
  $("snapshots-title").textContent = "Snapshots of " + computer.traposId;
  $("snapshot-detail").hidden = true;
  $("restore-result").replaceChildren();
  snapshotError("");
  snapshotStatus("listing…");
  drawSnapshots();
  loadSnapshots(computer);
}

// What the computer allows (it can change while shown): fs.read to take and compare,
// fs.write to restore.  Called on every change of the computers' list.
function snapshotsAllowed() {
  if (!state.selected || snaps.key !== keyOf(state.selected)) return;
  const name = state.selected.traposId;
  let why = "";
  if (!connectedNow()) why = "Computer " + name + " is not connected: its snapshots are listed, nothing can be taken, compared or restored.";
  else if (!has("fs.read")) why = "Snapshots need fs.read: " + name + " has not allowed it (on it, run \"sandbox allow fs.read\").";
  $("snapshots-notice").textContent = why;
  $("take-snapshot").disabled = snaps.busy || !connectedNow() || !has("fs.read");
  const canRestore = connectedNow() && has("fs.read") && has("fs.write");
  $("restore").disabled = snaps.busy || !canRestore;
  $("restore-needs").textContent = !connectedNow() || !has("fs.read") || canRestore ? ""
    : "Restoring needs fs.write (on " + name + ", run \"sandbox allow fs.write\").";
  if (!canRestore) closeRestore(false);
}

function busy(flag, text) {
  snaps.busy = flag;
  snapshotStatus(text);
  snapshotsAllowed();
}

// A snapshot taken or restored elsewhere (before an ask's first change, by trapsandbox-ctl,
// in another tab) is an entry of the activity shown: list the snapshots again.
function snapshotsMayHaveChanged(entry) {
  if (entry.type !== "snapshot" && entry.type !== "snapshot_restore") return;
  const computer = state.selected;
  if (computer && stillShown(computer) && !snaps.busy) loadSnapshots(computer);
}

async function loadSnapshots(computer) {
  const answer = await snapshotRequest(computer, "snapshots");
  if (!stillShown(computer)) return;
  if (!answer.ok) {
    snapshotError("The snapshots cannot be listed: " + failure(answer));
    return;
  }
  snaps.list = answer.payload.snapshots;
  if (snaps.list.length === 0) snapshotStatus("No snapshot of this computer yet.");
  else if ($("snapshots-status").textContent === "listing…") snapshotStatus("");
  drawSnapshots();
}

function drawSnapshots() {
  const body = $("snapshots").tBodies[0];
  body.replaceChildren();
  for (const s of snaps.list) {
    const row = document.createElement("tr");
    row.dataset.snapshot = s.id;
    if (s.reason === "ask") row.className = "ask";
    const pick = document.createElement("button");
    pick.type = "button";
    pick.textContent = "#" + s.id;
    pick.setAttribute("aria-label", "Snapshot " + s.id + ": show its changes");
    if (s.id === snaps.selected) pick.setAttribute("aria-current", "true");
    pick.addEventListener("click", () => selectSnapshot(s.id));
    const when = new Date(s.created);
    const cells = [pick, when.toLocaleString(), REASONS[s.reason] || s.reason, String(s.files), bytes(s.bytes)];
    for (const value of cells) {
      const cell = document.createElement("td");
      cell.append(value);
      row.append(cell);
    }
    row.cells[1].title = when.toISOString();
    row.cells[4].title = s.bytes + " bytes";
    if (s.reason === "ask") row.cells[2].classList.add("badge");
    body.append(row);
  }
  $("snapshots").hidden = snaps.list.length === 0;
}

async function takeSnapshot() {
  const computer = state.selected;
  snapshotError("");
  busy(true, "taking a snapshot…");
  const answer = await snapshotRequest(computer, "snapshot_take");
  if (!stillShown(computer)) return;
  if (!answer.ok) {
    busy(false, "");
    snapshotError("The snapshot was not taken: " + failure(answer));
    return;
  }
  const p = answer.payload;
  busy(false, "Snapshot " + p.id + " taken: " + p.files + " files, " + bytes(p.bytes) + " (" + p.fetched + " fetched).");
  await loadSnapshots(computer);
}

async function selectSnapshot(id, keepResult) {
  const computer = state.selected;
  snaps.selected = id;
  drawSnapshots();
  closeRestore(false);
  if (!keepResult) $("restore-result").replaceChildren();
  $("snapshot-detail").hidden = false;
  $("changes-title").textContent = "Changes since snapshot " + id;
  $("restore").textContent = "Restore snapshot " + id + "…";
  $("changes").replaceChildren();
  $("diffs").replaceChildren();
  if (!has("fs.read")) {
    $("changes-summary").textContent = "Comparing needs fs.read (on " + computer.traposId + ", run \"sandbox allow fs.read\").";
    return;
  }
  $("changes-summary").textContent = "comparing with the computer now…";
  const answer = await snapshotRequest(computer, "snapshot_changes", { snapshot: id });
  if (!stillShown(computer) || snaps.selected !== id) return;
  if (!answer.ok) {
    $("changes-summary").textContent = "";
    snapshotError("The changes cannot be shown: " + failure(answer));
    return;
  }
  snapshotError("");
  drawChanges(answer.payload);
}

function drawChanges(found) {
  const count = found.added.length + found.modified.length + found.deleted.length;
  $("changes-summary").textContent = count === 0
    ? "No changes: the computer's files are as in snapshot " + found.snapshot + "."
    : found.added.length + " added, " + found.modified.length + " modified, " + found.deleted.length + " deleted since snapshot " + found.snapshot + ".";
  const list = $("changes");
  const kinds = [["added", (c) => bytes(c.after)], ["modified", (c) => bytes(c.before) + " → " + bytes(c.after)], ["deleted", (c) => bytes(c.before)]];
  for (const [kind, size] of kinds) {
    const changes = found[kind];
    for (const c of changes.slice(0, SHOWN_CHANGES)) {
      const item = document.createElement("li");
      item.className = kind;
      const tag = document.createElement("span");
      tag.className = "kind";
      tag.textContent = kind;
      const path = document.createElement("code");
      path.textContent = c.path;
      item.append(tag, " ", path, " (" + size(c) + ")");
      list.append(item);
    }
    if (changes.length > SHOWN_CHANGES) {
      const more = document.createElement("li");
      more.textContent = "… and " + (changes.length - SHOWN_CHANGES) + " more " + kind;
      list.append(more);
    }
  }
  const diffs = $("diffs");
  for (const d of found.diffs) {
    const box = document.createElement("details");
    box.open = true;
    const summary = document.createElement("summary");
    summary.textContent = "diff " + d.path;
    const pre = document.createElement("pre");
    pre.className = "diff";
    for (const line of d.diff.split("\n")) {
      const span = document.createElement("span");
      if (line.startsWith("@@")) span.className = "hunk";
      else if (line.startsWith("+") && !line.startsWith("+++")) span.className = "add";
      else if (line.startsWith("-") && !line.startsWith("---")) span.className = "del";
      span.textContent = line + "\n";
      pre.append(span);
    }
    box.append(summary, pre);
    diffs.append(box);
  }
}

function askRestore() {
  const id = snaps.selected;
  if (id === null) return;
  $("restore-question").textContent = "Restore " + state.selected.traposId + "'s files to snapshot " + id
    + "? Files changed since are written back and files created since are deleted. A snapshot of the files"
    + " as they are now is taken first, so this can be undone too.";
  $("restore-confirm").hidden = false;
  $("restore").setAttribute("aria-expanded", "true");
  $("restore-no").focus();  // the safe choice first: Enter cancels, Tab then Enter restores
}

function closeRestore(refocus) {
  const open = !$("restore-confirm").hidden;
  $("restore-confirm").hidden = true;
  $("restore").setAttribute("aria-expanded", "false");
  if (open && refocus) $("restore").focus();
}

async function restoreSnapshot() {
  const computer = state.selected;
  const id = snaps.selected;
  closeRestore(false);
  snapshotError("");
  busy(true, "restoring snapshot " + id + "…");
  const answer = await snapshotRequest(computer, "snapshot_restore", { snapshot: id });
  if (!stillShown(computer)) return;
  busy(false, "");
  if (!answer.ok) {
    snapshotError("Snapshot " + id + " was not restored: " + failure(answer));
    $("restore").focus();
    return;
  }
  drawRestored(answer.payload);
  await loadSnapshots(computer);
  await selectSnapshot(id, true);
  $("restore-result").focus();
}

// What the restore did, and how to undo it: its `before` snapshot.
function drawRestored(done) {
  const result = $("restore-result");
  result.replaceChildren();
  result.tabIndex = -1;
  const said = document.createElement("p");
  const list = (paths) => paths.length ? ": " + paths.join(", ") : "";
  said.textContent = "Restored snapshot " + done.restored + ". Written " + done.written.length + list(done.written)
    + ". Deleted " + done.deleted.length + list(done.deleted) + ".";
  const undo = document.createElement("p");
  undo.append("The files as they were just before are snapshot " + done.before + ": restore it to undo this. ");
  const show = document.createElement("button");
  show.type = "button";
  show.textContent = "Show snapshot " + done.before;
  show.addEventListener("click", () => selectSnapshot(done.before));
  undo.append(show);
  result.append(said, undo);
}
