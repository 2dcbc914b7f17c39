// A computer's files, whole, over the computers' socket (SPEC §9): the computer answers
// read_file at most 64 KiB of content a frame, so a file is read in ranges; it is written by
// the gateway's file_write, which sends it in parts ({offset, final, size}: the parts go to a
// temporary file beside the target and the final one moves it into place, so the file is
// replaced whole or not at all).
// Bytes are Uint8Arrays throughout (binary safe); base64 only on the wire.

import { bytes, failure, operatorRequest } from "./operator.js";

const PART_BYTES = 64 * 1024;           // the computer's limit of content in one frame (reads)
export const MAX_TRANSFER_BYTES = 1024 * 1024;  // the gateway's request limit for one file (limits.MAX_FILE_BYTES)

export class TransferError extends Error {
  constructor(message, answer) {
    super(message);
    this.code = answer && answer.error && answer.error.code;
  }
}

function toBase64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

function fromBase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

export async function fileRequest(computer, type, payload, onPartial) {
  const answer = await operatorRequest(computer, type, payload, onPartial);
  if (!answer.ok) throw new TransferError(failure(answer), answer);
  return answer.payload;
}

// Its size now, without its content (a read of no bytes).
export async function fileSize(computer, path) {
  const got = await fileRequest(computer, "read_file", { path, offset: 0, length: 0, encoding: "base64" });
  return got.sizeBytes;
}

// The whole file as bytes; `progress(done, total)` after each range. A file that grows past
// the limit, or changes size while read, is an error: what was read would be no version of it.
export async function readWhole(computer, path, progress) {
  let got = await fileRequest(computer, "read_file", { path, offset: 0, length: PART_BYTES, encoding: "base64" });
  const total = got.sizeBytes;
  if (total > MAX_TRANSFER_BYTES) {
    throw new TransferError(path + " is " + bytes(total) + ": the console reads files up to " + bytes(MAX_TRANSFER_BYTES));
  }
  const whole = new Uint8Array(total);
  let done = 0;
  for (;;) {
    const part = fromBase64(got.content);
    if (got.sizeBytes !== total || done + part.length > total) {
      throw new TransferError(path + " changed on the computer while it was read: try again");
    }
    whole.set(part, done);
    done += part.length;
    if (progress) progress(done, total);
    if (done >= total || part.length === 0) break;
    got = await fileRequest(computer, "read_file", { path, offset: done, length: PART_BYTES, encoding: "base64" });
  }
  if (done !== total) throw new TransferError(path + " changed on the computer while it was read: try again");
  return whole;
}

// Writes `data` (a Uint8Array) as `path`: one file_write, which the gateway sends to the
// computer in parts, quietly, the last one moving it into place; the computer's activity shows
// it as one entry (web/filecalls.py). `progress(done, total)` when it is sent and after each
// part the computer has written (the gateway's partials {written, size}).
export async function writeWhole(computer, path, data, progress) {
  if (data.length > MAX_TRANSFER_BYTES) {
    throw new TransferError("it is " + bytes(data.length) + ": the console writes files up to " + bytes(MAX_TRANSFER_BYTES));
  }
  if (progress) progress(0, data.length);
  const written = progress ? (part) => progress(part.written, part.size) : undefined;
  await fileRequest(computer, "file_write", { path, content: toBase64(data) }, written);
  if (progress) progress(data.length, data.length);
}

function sameBytes(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

// What the computer holds at `path` now, compared with `opened` (the bytes the editor was
// given): null when unchanged, else {now: bytes or null if deleted, why}. The size is asked
// first (no content moves when it differs); a file of the same size is read whole and compared
// byte for byte. CraftOS keeps a modification time only to the second, and not at all on older
// versions, so the content is the only sure sign.
export async function changedSince(computer, path, opened) {
  let size;
  try {
    size = await fileSize(computer, path);
  } catch (error) {
    if (error.code === "fs_error" && /No such file/.test(error.message)) return { now: null, why: "it was deleted" };
    throw error;
  }
  if (size !== opened.length) {
    return { now: await readWhole(computer, path), why: "its size went from " + bytes(opened.length) + " to " + bytes(size) };
  }
  const now = await readWhole(computer, path);
  return sameBytes(now, opened) ? null : { now, why: "its content changed (same size)" };
}
