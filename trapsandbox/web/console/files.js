// The files panel (issue 34): the selected computer's files as a tree, listed a folder at a
// time as it is opened; one file open in the code editor (editor.js: CodeMirror 6, Lua
// highlighted), saved as one atomic write after checking that nobody changed it on the
// computer since it was opened (transfer.js, changedSince); new file, new folder, rename,
// delete (asked first), upload from the desktop and download, up to 1 MiB, with progress.
//
// Everything goes through the computer's own request types (list_files and read_file need
// fs.read; write_file and delete_file fs.write): the computer refuses what its player has not
// allowed, and the panel says what to allow. A change made of several requests (a save in
// parts, a rename, a new folder) is one gateway request (file_write, file_move, folder_make),
// so that each change is one entry in the computer's activity, by the player.
// Paths and names from the computer are set as text, never as HTML.

import { $, bytes, connectedNow, has, keyOf, state } from "./operator.js";
import {
  MAX_TRANSFER_BYTES, TransferError, changedSince, fileRequest, fileSize, readWhole, writeWhole,
} from "./transfer.js";

const files = {
  key: null,          // the computer shown (keyOf)
  loaded: false,      // whether its root was listed (fs.read may be allowed later)
  selected: null,     // {path, type} chosen in the tree: what rename, delete, download act on
  open: null,         // {path, opened: Uint8Array, editor, dirty, readOnly}
  busy: false,
  confirm: null,      // the resolve of the question asked (askFiles)
  name: null,         // the resolve of the path asked (askPath)
};
const DRIVE_NAME = /^disk\d*$/;  // CraftOS mounts disk drives at /disk, /disk2, ...

function filesError(text) { $("files-error").textContent = text || ""; }
function filesStatus(text) { $("files-status").textContent = text || ""; }
function filesShown(computer) { return files.key === keyOf(computer); }
function parentOf(path) { const cut = path.lastIndexOf("/"); return cut <= 0 ? "/" : path.slice(0, cut); }
function join(folder, name) { return (folder === "/" ? "" : folder) + "/" + name; }
function nameOf(path) { return path.slice(path.lastIndexOf("/") + 1); }

// "/a//b/" -> "/a/b"; null for a path that names nothing or climbs out.
function cleanPath(text) {
  const parts = text.trim().split("/").filter((p) => p !== "" && p !== ".");
  if (parts.length === 0 || parts.includes("..")) return null;
  return "/" + parts.join("/");
}

export function setUpFiles() {
  window.addEventListener("beforeunload", (event) => {
    if (files.open && files.open.dirty) event.preventDefault();  // the browser asks to leave
  });
  $("file-new").addEventListener("click", newFile);
  $("folder-new").addEventListener("click", newFolder);
  $("file-rename").addEventListener("click", renameFile);
  $("file-delete").addEventListener("click", deleteSelected);
  $("file-download").addEventListener("click", downloadSelected);
  $("file-upload").addEventListener("change", uploadChosen);
  $("files-refresh").addEventListener("click", () => listRoot(state.selected));
  $("file-save").addEventListener("click", () => saveFile(false));
  $("files-yes").addEventListener("click", () => answerFiles(true));
  $("files-no").addEventListener("click", () => answerFiles(false));
  $("files-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") { event.preventDefault(); answerFiles(false); }
  });
  $("name-form").addEventListener("submit", (event) => { event.preventDefault(); answerPath($("name-path").value); });
  $("name-cancel").addEventListener("click", () => answerPath(null));
  $("conflict-overwrite").addEventListener("click", () => { closeConflict(); saveFile(true); });
  $("conflict-theirs").addEventListener("click", loadTheirs);
  $("conflict-keep").addEventListener("click", () => { closeConflict(); files.open.editor.focus(); });
}

// -- Which computer, and what it allows ------------------------------------------------------

export function showFiles(computer) {
  closeFile();
  answerFiles(false);
  answerPath(null);
  files.key = keyOf(computer);
  files.loaded = false;
  files.selected = null;
  files.busy = false;
  $("files-area").hidden = false;
  $("files-title").textContent = "Files of " + computer.traposId;
  $("file-tree").replaceChildren();
  filesError("");
  filesStatus("");
  filesAllowed();
}

// Called on every change of the computers' list: the panel follows what the computer allows.
export function filesAllowed() {
  if (!state.selected || files.key !== keyOf(state.selected)) return;
  const name = state.selected.traposId;
  const reading = connectedNow() && has("fs.read");
  const writing = reading && has("fs.write");
  let why = "";
  if (!connectedNow()) why = "Computer " + name + " is not connected: its files cannot be shown.";
  else if (!has("fs.read")) why = "Files need fs.read: " + name + " has not allowed it (on it, run \"sandbox allow fs.read\").";
  else if (!has("fs.write")) why = "Read-only: " + name + " has not allowed fs.write (on it, run \"sandbox allow fs.write\") to save, create, rename, delete or upload.";
  $("files-notice").textContent = why;
  const chosenFile = files.selected && files.selected.type === "file";
  const chosenWritable = files.selected && !files.selected.readOnly;
  $("file-new").disabled = files.busy || !writing;
  $("folder-new").disabled = files.busy || !writing;
  $("file-upload").disabled = files.busy || !writing;
  $("file-rename").disabled = files.busy || !writing || !files.selected || !chosenWritable;
  $("file-delete").disabled = files.busy || !writing || !files.selected || !chosenWritable;
  $("file-download").disabled = files.busy || !reading || !chosenFile;
  $("files-refresh").disabled = files.busy || !reading;
  if (files.open) {
    const locked = !writing || files.open.readOnly;
    files.open.editor.setReadOnly(locked);
    $("file-save").disabled = files.busy || locked || !files.open.dirty;
  }
  if (reading && !files.loaded) listRoot(state.selected);
  if (!reading) { $("file-tree").replaceChildren(); files.loaded = false; }
}

function filesBusy(flag, text) {
  files.busy = flag;
  filesStatus(text);
  filesAllowed();
}

function progress(verb, name) {
  const bar = $("files-progress");
  return (done, total) => {
    bar.hidden = false;
    bar.max = Math.max(total, 1);
    bar.value = done;
    filesStatus(verb + " " + name + ": " + bytes(done) + " of " + bytes(total));
  };
}

function progressDone() { $("files-progress").hidden = true; }

// -- The tree ---------------------------------------------------------------------------------

async function listRoot(computer) {
  files.loaded = true;
  filesError("");
  await listInto($("file-tree"), computer, "/");
}

// Lists `folder` into `list` (a <ul>), folders first; a failure is said in the panel.
// The folders open in it stay open (listed again).
async function listInto(list, computer, folder) {
  const wasOpen = [...list.children]
    .filter((item) => item.getAttribute("aria-expanded") === "true")
    .map((item) => item.firstChild.dataset.path);
  let got;
  try {
    got = await fileRequest(computer, "list_files", { path: folder });
  } catch (error) {
    if (filesShown(computer)) filesError("Cannot list " + folder + ": " + error.message);
    return;
  }
  if (!filesShown(computer)) return;
  const entries = [...got.entries].sort((a, b) =>
    (a.type === b.type ? 0 : a.type === "dir" ? -1 : 1) || a.name.localeCompare(b.name));
  list.replaceChildren(...entries.map((entry) => treeItem(computer, folder, entry)));
  const chosen = files.selected && treeButton(files.selected.path);
  if (chosen) chosen.setAttribute("aria-current", "true");
  await Promise.all(wasOpen.map((path) => {
    const button = treeButton(path);
    return button ? expand(button.parentElement, computer, path) : null;
  }));
}

function expand(item, computer, path) {
  item.setAttribute("aria-expanded", "true");
  const group = item.querySelector("ul");
  group.hidden = false;
  return listInto(group, computer, path);
}

function mark(text, kind, title) {
  const span = document.createElement("span");
  span.className = "mark " + kind;
  span.textContent = text;
  span.title = title;
  const spaced = document.createDocumentFragment();
  spaced.append(" ", span);
  return spaced;
}

function treeItem(computer, folder, entry) {
  const path = join(folder, entry.name);
  const item = document.createElement("li");
  item.setAttribute("role", "treeitem");
  const button = document.createElement("button");
  button.type = "button";
  button.dataset.path = path;
  button.textContent = entry.name;
  item.append(button);
  const chosen = { path, type: entry.type, readOnly: entry.readOnly };
  if (entry.type === "dir") {
    item.className = "dir";
    item.setAttribute("aria-expanded", "false");
    if (folder === "/" && entry.name === "rom" && entry.readOnly) {
      button.append(mark("ROM", "ro", "CraftOS's own programs: read-only"));
    } else if (folder === "/" && DRIVE_NAME.test(entry.name)) {
      button.append(mark("drive", "drive", "a disk in a disk drive beside the computer"));
    } else if (entry.readOnly) {
      button.append(mark("read-only", "ro", "the computer cannot change it"));
    }
    const group = document.createElement("ul");
    group.setAttribute("role", "group");
    group.hidden = true;
    item.append(group);
    button.addEventListener("click", () => {
      choose(chosen);
      if (item.getAttribute("aria-expanded") === "true") {
        item.setAttribute("aria-expanded", "false");
        group.hidden = true;
      } else {
        expand(item, computer, path);
      }
    });
  } else {
    item.className = "file";
    const size = document.createElement("span");
    size.className = "size";
    size.textContent = " " + bytes(entry.size);
    button.append(size);
    if (entry.readOnly) button.append(mark("read-only", "ro", "the computer cannot change it"));
    button.addEventListener("click", () => { choose(chosen); openFile(computer, path, entry.readOnly); });
  }
  return item;
}

function choose(entry) {
  files.selected = entry;
  for (const b of $("file-tree").querySelectorAll("button[aria-current]")) b.removeAttribute("aria-current");
  const button = treeButton(entry.path);
  if (button) button.setAttribute("aria-current", "true");
  filesAllowed();
}

function treeButton(path) {
  return [...$("file-tree").querySelectorAll("button[data-path]")].find((b) => b.dataset.path === path);
}

// Lists `folder` again where it is shown (the root, or an open folder).
async function refresh(computer, folder) {
  if (folder === "/") return listInto($("file-tree"), computer, "/");
  const button = treeButton(folder);
  const item = button && button.parentElement;
  if (item && item.getAttribute("aria-expanded") === "true") await listInto(item.querySelector("ul"), computer, folder);
}

// -- Questions asked in the panel -------------------------------------------------------------

// Asks `question`; resolves true when `yes` is chosen. The safe choice has the focus.
function askFiles(question, yes) {
  answerFiles(false);
  $("files-question").textContent = question;
  $("files-yes").textContent = yes;
  $("files-confirm").hidden = false;
  $("files-no").focus();
  return new Promise((resolve) => { files.confirm = resolve; });
}

function answerFiles(yes) {
  $("files-confirm").hidden = true;
  const resolve = files.confirm;
  files.confirm = null;
  if (resolve) resolve(yes);
}

// Asks for a path (`label`, starting from `start`); resolves with it cleaned, or null.
function askPath(label, start) {
  answerPath(null);
  $("name-label").textContent = label;
  $("name-form").hidden = false;
  const field = $("name-path");
  field.value = start;
  field.focus();
  return new Promise((resolve) => { files.name = resolve; });
}

function answerPath(text) {
  $("name-form").hidden = true;
  const resolve = files.name;
  files.name = null;
  if (!resolve) return;
  if (text === null) { resolve(null); return; }
  const path = cleanPath(text);
  if (path === null) filesError("\"" + text + "\" is not a path: give one like /programs/hello.lua");
  resolve(path);
}

// The folder new things go in: the one chosen, or the chosen file's.
function chosenFolder() {
  if (!files.selected) return "/";
  return files.selected.type === "dir" ? files.selected.path : parentOf(files.selected.path);
}

// "file", "dir" or null (nothing there).
async function kindOf(computer, path) {
  try {
    await fileSize(computer, path);
    return "file";
  } catch (error) {
    if (/Is a directory/.test(error.message)) return "dir";
    if (/No such file/.test(error.message)) return null;
    throw error;
  }
}

// Runs `work` as the panel's one operation: buttons off meanwhile, its failure said.
// Resolves whether it succeeded.
async function operation(computer, text, work) {
  filesError("");
  filesBusy(true, text);
  try {
    const said = await work();
    if (filesShown(computer)) filesBusy(false, said || "");
    return true;
  } catch (error) {
    if (filesShown(computer)) {
      filesBusy(false, "");
      filesError(error.message);
    }
    return false;
  } finally {
    progressDone();
  }
}

async function mustBeFree(computer, path) {
  const kind = await kindOf(computer, path);
  if (kind) throw new TransferError(path + " already exists (a " + (kind === "dir" ? "folder" : "file") + ")");
}

// -- Creating, renaming, deleting -------------------------------------------------------------

async function newFile() {
  const computer = state.selected;
  const path = await askPath("New file", join(chosenFolder(), ""));
  if (!path) return;
  const made = await operation(computer, "creating " + path + "…", async () => {
    await mustBeFree(computer, path);
    await writeWhole(computer, path, new Uint8Array(0));
    await refresh(computer, parentOf(path));
    choose({ path, type: "file", readOnly: false });
    return "Created " + path + ".";
  });
  if (made) await openFile(computer, path, false);
}

// The gateway makes a folder (folder_make: in one step on the computer, or with an older client
// an empty file written in it and deleted, quietly; one that exists is left as it is): one
// entry in the activity.
async function newFolder() {
  const computer = state.selected;
  const path = await askPath("New folder", join(chosenFolder(), ""));
  if (!path) return;
  await operation(computer, "creating " + path + "…", async () => {
    await mustBeFree(computer, path);
    await fileRequest(computer, "folder_make", { path });
    await refresh(computer, parentOf(path));
    return "Created the folder " + path + ".";
  });
}

// A file or a folder is renamed by the gateway (file_move: in one step on the computer, or with
// an older client each file read, written under the new name, then the old deleted, quietly;
// a move into itself is refused however it is spelt): one entry in the activity.
async function renameFile() {
  const computer = state.selected;
  const { path: from, type } = files.selected;
  const open = files.open;
  if (open && (open.path === from || open.path.startsWith(from + "/")) && open.dirty) {
    filesError("Save or undo your changes to " + open.path + " before renaming it.");
    return;
  }
  const to = await askPath("Rename " + from + " to", from);
  if (!to || to === from) return;
  if (to.startsWith(from + "/")) { filesError("A folder cannot be moved into itself."); return; }
  await operation(computer, "renaming " + from + "…", async () => {
    await mustBeFree(computer, to);
    await fileRequest(computer, "file_move", { from, to });
    await refresh(computer, parentOf(from));
    if (parentOf(to) !== parentOf(from)) await refresh(computer, parentOf(to));
    choose({ path: to, type, readOnly: false });
    if (open && files.open === open && (open.path === from || open.path.startsWith(from + "/"))) {
      open.path = to + open.path.slice(from.length);
      $("file-path").textContent = open.path;
    }
    return "Renamed " + from + " to " + to + ".";
  });
}

async function deleteSelected() {
  const computer = state.selected;
  const { path, type } = files.selected;
  const what = type === "dir" ? "the folder " + path + " and everything in it" : path;
  if (!await askFiles("Delete " + what + " from " + computer.traposId + "? This cannot be undone here"
    + " (a snapshot taken before can restore it).", "Delete")) return;
  await operation(computer, "deleting " + path + "…", async () => {
    await fileRequest(computer, "delete_file", { path });
    if (files.open && (files.open.path === path || files.open.path.startsWith(path + "/"))) closeFile();
    files.selected = null;
    await refresh(computer, parentOf(path));
    return "Deleted " + path + ".";
  });
}

// -- Upload and download ----------------------------------------------------------------------

async function uploadChosen() {
  const input = $("file-upload");
  const chosen = input.files[0];
  input.value = "";
  if (!chosen) return;
  const computer = state.selected;
  const path = join(chosenFolder(), chosen.name);
  if (chosen.size > MAX_TRANSFER_BYTES) {
    filesError(chosen.name + " is " + bytes(chosen.size) + ": the console uploads files up to " + bytes(MAX_TRANSFER_BYTES) + ".");
    return;
  }
  let kind;
  try {
    kind = await kindOf(computer, path);
  } catch (error) {
    filesError(error.message);
    return;
  }
  if (kind === "dir") { filesError(path + " is a folder."); return; }
  if (kind === "file" && !await askFiles(path + " exists on " + computer.traposId + ". Replace it with "
    + chosen.name + " (" + bytes(chosen.size) + ")?", "Replace")) return;
  await operation(computer, "uploading " + chosen.name + "…", async () => {
    const data = new Uint8Array(await chosen.arrayBuffer());
    await writeWhole(computer, path, data, progress("uploading", chosen.name));
    await refresh(computer, parentOf(path));
    return "Uploaded " + path + " (" + bytes(data.length) + ").";
  });
}

async function downloadSelected() {
  const computer = state.selected;
  const path = files.selected.path;
  await operation(computer, "downloading " + path + "…", async () => {
    const data = await readWhole(computer, path, progress("downloading", path));
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([data], { type: "application/octet-stream" }));
    link.download = nameOf(path);
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    return "Downloaded " + path + " (" + bytes(data.length) + ").";
  });
}

// -- The open file ----------------------------------------------------------------------------

function closeFile() {
  closeConflict();
  if (files.open) files.open.editor.destroy();
  files.open = null;
  $("editor").replaceChildren();
  $("file-view").hidden = true;
}

// A read-only text area when the editor bundle is missing (a tree built without npm).
function plainEditor(parent, text) {
  const area = document.createElement("textarea");
  area.readOnly = true;
  area.value = text;
  area.setAttribute("aria-label", "File (read-only: the editor was not built)");
  parent.append(area);
  return { text: () => area.value, setText(t) { area.value = t; }, setReadOnly() {}, focus: () => area.focus(), destroy() {} };
}

function fileState(text) { $("file-state").textContent = text; }

async function openFile(computer, path, readOnly) {
  if (files.open && files.open.dirty && files.open.path !== path
    && !await askFiles("Discard your changes to " + files.open.path + "?", "Discard")) return;
  await operation(computer, "opening " + path + "…", async () => {
    const data = await readWhole(computer, path, progress("reading", path));
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(data);
    } catch {
      throw new TransferError(path + " is not text (" + bytes(data.length) + "): download it instead.");
    }
    closeFile();
    const parent = $("editor");
    const lua = /\.lua$/.test(path) || !/\.[^/]*$/.test(nameOf(path));
    const options = {
      text, lua, readOnly: true, label: "File " + path,
      onChange: () => { if (files.open && !files.open.dirty) { files.open.dirty = true; fileState("edited"); filesAllowed(); } },
      onSave: () => { if (!$("file-save").disabled) saveFile(false); },
    };
    const editor = window.TrapEditor ? window.TrapEditor.create(parent, options) : plainEditor(parent, text);
    files.open = { path, opened: data, editor, dirty: false, readOnly: Boolean(readOnly) || !window.TrapEditor };
    $("file-path").textContent = path;
    fileState(window.TrapEditor ? "" : "read-only: the console's editor was not built (make)");
    $("file-view").hidden = false;
    return "Opened " + path + " (" + bytes(data.length) + ").";
  });
}

// Saves the open file: unless `overwrite`, first whether the computer's copy is still the one
// opened (changedSince); if not, the player chooses (closeConflict's buttons).
async function saveFile(overwrite) {
  const computer = state.selected;
  const open = files.open;
  const data = new TextEncoder().encode(open.editor.text());
  await operation(computer, "saving " + open.path + "…", async () => {
    if (!overwrite) {
      const changed = await changedSince(computer, open.path, open.opened);
      if (changed) {
        showConflict(open, changed);
        return "Not saved: " + open.path + " changed on the computer.";
      }
    }
    await writeWhole(computer, open.path, data, progress("saving", open.path));
    if (files.open !== open) return "Saved " + open.path + ".";
    open.opened = data;
    open.dirty = false;
    fileState("saved");
    await refresh(computer, parentOf(open.path));
    return "Saved " + open.path + " (" + bytes(data.length) + ").";
  });
}

function showConflict(open, changed) {
  open.theirs = changed.now;
  $("conflict-question").textContent = open.path + " changed on the computer since you opened it: "
    + changed.why + ". Overwrite it with your version, or load the computer's?";
  $("conflict-theirs").disabled = changed.now === null;
  $("file-conflict").hidden = false;
  $("conflict-keep").focus();
}

function closeConflict() { $("file-conflict").hidden = true; }

function loadTheirs() {
  closeConflict();
  const open = files.open;
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(open.theirs);
  } catch {
    filesError("The computer's " + open.path + " is not text now: download it instead.");
    return;
  }
  open.editor.setText(text);
  open.opened = open.theirs;
  open.dirty = false;
  fileState("the computer's version");
  filesAllowed();
}
