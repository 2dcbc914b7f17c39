// What the console's modules share (SPEC §14): the page's state and its elements, the
// computers' /operator socket (opened with the token as its first message, never in a URL) and
// the requests about the selected computer that go over it (operatorRequest, answered by id),
// and how an answer's failure and a size are said.

export const TOKEN_KEY = "trapsandbox.token";

export const $ = (id) => document.getElementById(id);
export const state = {
  computers: [], selected: null, list: null, watch: null, screenEnded: false, nextId: 1, rows: [],
};

// -- Requests over the computers' socket (snapshots, files) ------------------------------------
export const REQUEST_ID = "req-";
const requests = { pending: new Map(), next: 1 };

// One /operator request about `computer`; resolves with the answer (an error answer if the
// socket is not open or closes first). `onPartial` hears each partial answer before it (an
// ask's, agent.js); `onSent` is told the request's id once it is sent (to name it later).
export function operatorRequest(computer, type, payload, onPartial, onSent) {
  return new Promise((resolve) => {
    const ws = state.list;
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      resolve({ ok: false, error: { message: "not connected to the gateway" } });
      return;
    }
    const id = REQUEST_ID + requests.next++;
    requests.pending.set(id, { resolve, onPartial });
    const message = { id, traposId: computer.traposId, account: computer.accountId, type };
    if (payload) message.payload = payload;
    ws.send(JSON.stringify(message));
    if (onSent) onSent(id);
  });
}

export function requestAnswered(message) {
  const pending = requests.pending.get(message.id);
  if (!pending) return;
  if (message.partial) {
    if (pending.onPartial) pending.onPartial(message.payload);
    return;
  }
  requests.pending.delete(message.id);
  pending.resolve(message);
}

export function requestsSocketEnded() {
  const pending = [...requests.pending.values()];
  requests.pending.clear();
  for (const { resolve } of pending) resolve({ ok: false, error: { message: "the connection to the gateway closed" } });
}

export function keyOf(c) { return c.accountId + "\u0000" + c.traposId; }

// An /operator socket: the token first; `onReady` once authenticated, `onMessage` after.
export function operatorSocket(onReady, onMessage, onEnd) {
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

export function failure(answer) {
  const error = answer.error || {};
  return (typeof error === "string" ? error : error.message) || "failed (" + answer.status + ")";
}

export function has(capability) {
  return Boolean(state.selected && state.selected.capabilities.includes(capability));
}

export function connectedNow() {
  return Boolean(state.selected && state.computers.some((c) => keyOf(c) === keyOf(state.selected)));
}

export function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(2) + " MiB";
}
