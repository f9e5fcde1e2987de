// Calls to this server's API: the key (asked for when the server refuses
// a request without it, kept in this browser), JSON requests, and
// streamed replies read as server-sent events. Every request goes to the
// page's own origin.

const KEY_ITEM = "spindle.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY_ITEM) || "";
}

export function forgetKey() {
  localStorage.removeItem(KEY_ITEM);
}

// An error the API answered with: its HTTP status and message.
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Asks for the key in the page's dialog; resolves to true when one was
// given, false when the user cancelled.
function askForKey(reason) {
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  if (!dialog) return Promise.resolve(false);
  error.hidden = !reason;
  error.textContent = reason || "";
  input.value = "";
  return new Promise((resolve) => {
    const form = document.getElementById("key-form");
    const cancel = document.getElementById("key-cancel");
    const done = (ok) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      dialog.close();
      resolve(ok);
    };
    const onSubmit = (e) => {
      e.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      localStorage.setItem(KEY_ITEM, key);
      done(true);
    };
    const onCancel = (e) => {
      e.preventDefault();
      done(false);
    };
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    input.focus();
  });
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The error message of a refused request (the API's JSON error, or the
// status line).
async function errorOf(resp) {
  let message = resp.status + " " + resp.statusText;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) {
    // Not JSON: keep the status line.
  }
  return new ApiError(resp.status, message);
}

// `fetch` of `path` on this server with the key; a 401 asks for a key and
// tries again (until the user cancels).
export async function request(method, path, body, signal) {
  for (;;) {
    const resp = await fetch(path, {
      method,
      headers: headers(),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (resp.status !== 401) {
      if (!resp.ok) throw await errorOf(resp);
      return resp;
    }
    const err = await errorOf(resp);
    const given = await askForKey(apiKey() ? "That key was refused: " + err.message : "");
    if (!given) throw err;
  }
}

export async function getJson(path) {
  return (await request("GET", path)).json();
}

export async function postJson(path, body) {
  return (await request("POST", path, body)).json();
}

// Streams a chat or text completion (`path`): calls `onChunk` with each
// parsed chunk until the server's `[DONE]`; `signal` aborts it (the server
// then cancels the request).
export async function streamReply(path, body, onChunk, signal) {
  const resp = await request("POST", path, body, signal);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message);
        onChunk(chunk);
      }
    }
  }
}
