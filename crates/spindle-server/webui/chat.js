// The chat page: conversations kept in this browser (localStorage), each
// with its own settings; replies streamed from /v1/chat/completions with a
// stop button, rendered as Markdown through text nodes only, and each
// followed by what it cost (tokens per second, tokens per pass, drafts).

import { ApiError, forgetKey, getJson, streamReply } from "/webui/api.js";
import { renderMarkdown } from "/webui/markdown.js";
import { initDecide } from "/webui/decide.js";

const STORE = "spindle.chat.v1";
const DEFAULT_TITLE = "New chat";
const DEFAULTS = {
  system: "",
  temperature: 0.7,
  top_p: 0.95,
  max_tokens: 512,
  seed: "",
  speculation: true,
  schema: "",
  // Continue the text instead of chatting (no chat template): what a base
  // model is for.
  complete: false,
};

const $ = (id) => document.getElementById(id);

let store = load();
let model = null;
// The reply being streamed: its conversation, message and abort handle.
let streaming = null;

function load() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE));
    if (s && Array.isArray(s.conversations)) return s;
  } catch (_) {
    // A damaged store starts over.
  }
  return { conversations: [], current: null };
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(store));
}

function newConversation() {
  const c = {
    id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
    title: DEFAULT_TITLE,
    created: Date.now(),
    settings: { ...DEFAULTS },
    messages: [],
  };
  store.conversations.unshift(c);
  store.current = c.id;
  save();
  return c;
}

function current() {
  let c = store.conversations.find((c) => c.id === store.current);
  if (!c) c = store.conversations[0] || newConversation();
  store.current = c.id;
  return c;
}

// ---- the conversation list ----

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of store.conversations) {
    const li = document.createElement("li");
    li.className = "conversation" + (c.id === store.current ? " active" : "");
    li.dataset.id = c.id;
    const open = button("open", c.title, c.title, c.title, () => select(c.id));
    if (c.id === store.current) open.setAttribute("aria-current", "true");
    const rename = button("icon-button small rename", "✎", "Rename", "Rename " + c.title, () => startRename(li, c));
    const del = button("icon-button small delete", "✕", "Delete", "Delete " + c.title, () => askDelete(del, c));
    li.append(open, rename, del);
    ul.appendChild(li);
  }
}

// A button of the conversation list.
function button(className, text, title, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  b.title = title;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

function startRename(li, c) {
  const input = document.createElement("input");
  input.type = "text";
  input.value = c.title;
  input.className = "rename-input";
  input.setAttribute("aria-label", "New name");
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    const t = input.value.trim();
    if (keep && t) c.title = t.slice(0, 80);
    save();
    renderList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
}

// A first press arms the button; a second within 4 s deletes.
function askDelete(button, c) {
  if (button.dataset.armed === "1") {
    if (streaming && streaming.conv === c) streaming.controller.abort();
    store.conversations = store.conversations.filter((x) => x.id !== c.id);
    if (store.current === c.id) store.current = null;
    save();
    renderAll();
    return;
  }
  button.dataset.armed = "1";
  button.textContent = "Delete?";
  button.classList.add("armed");
  setTimeout(() => {
    if (!button.isConnected) return;
    button.dataset.armed = "";
    button.textContent = "✕";
    button.classList.remove("armed");
  }, 4000);
}

function select(id) {
  store.current = id;
  save();
  renderAll();
  if (window.matchMedia("(max-width: 760px)").matches) setSidebar(false);
  $("composer-input").focus();
}

// ---- messages ----

function statsText(s) {
  const parts = [];
  if (s.tokens_per_second !== null) parts.push(s.tokens_per_second.toFixed(1) + " tok/s");
  if (s.passes) parts.push((s.completion_tokens / s.passes).toFixed(2) + " tokens/pass");
  if (s.drafted) parts.push(s.accepted + " of " + s.drafted + " drafted accepted");
  parts.push(s.completion_tokens + " tokens");
  if (s.first_token_ms !== null) parts.push("first token " + Math.round(s.first_token_ms) + " ms");
  return parts.join(" · ");
}

function messageNode(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = m.role === "user" ? "You" : model || "Model";
  const body = document.createElement("div");
  body.className = "body";
  fillBody(body, m);
  div.append(who, body);
  const foot = document.createElement("div");
  foot.className = "stats";
  if (m.stats) foot.textContent = statsText(m.stats);
  if (m.stopped) foot.textContent = (foot.textContent ? foot.textContent + " · " : "") + "stopped";
  if (m.error) {
    foot.textContent = "error: " + m.error;
    foot.classList.add("error");
  }
  div.appendChild(foot);
  return div;
}

function fillBody(body, m) {
  if (m.role === "user") {
    body.textContent = m.content;
  } else if (m.reasoning) {
    // A reasoning model's thinking (`reasoning_content`), folded away
    // unless opened; the answer below it.
    const thinking = document.createElement("details");
    thinking.className = "thinking";
    thinking.open = !!m.thinkingOpen;
    thinking.addEventListener("toggle", () => { m.thinkingOpen = thinking.open; });
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    text.textContent = m.reasoning;
    thinking.append(summary, text);
    body.replaceChildren(thinking, renderMarkdown(m.content));
  } else {
    body.replaceChildren(renderMarkdown(m.content));
  }
}

function renderMessages() {
  const box = $("messages");
  const c = current();
  box.replaceChildren(...c.messages.map(messageNode));
  if (c.messages.length === 0) {
    const hint = document.createElement("p");
    hint.className = "empty";
    hint.textContent = "Send a message to start. The default model is a small base model: it continues text more than it chats.";
    box.appendChild(hint);
  }
  box.scrollTop = box.scrollHeight;
}

// Redraws the last message (the reply being streamed) at most once a frame.
let redrawPending = false;
function redrawLast() {
  if (redrawPending) return;
  redrawPending = true;
  requestAnimationFrame(() => {
    redrawPending = false;
    const box = $("messages");
    const last = box.lastElementChild;
    const c = current();
    if (!last || !streaming || streaming.conv !== c) return;
    fillBody(last.querySelector(".body"), streaming.msg);
    box.scrollTop = box.scrollHeight;
  });
}

// ---- settings ----

const FIELDS = [
  ["set-system", "system", "text"],
  ["set-temperature", "temperature", "number"],
  ["set-top-p", "top_p", "number"],
  ["set-max-tokens", "max_tokens", "number"],
  ["set-seed", "seed", "text"],
  ["set-speculation", "speculation", "check"],
  ["set-complete", "complete", "check"],
  ["set-schema", "schema", "text"],
];

function renderSettings() {
  const s = current().settings;
  for (const [id, key, kind] of FIELDS) {
    const input = $(id);
    if (kind === "check") input.checked = !!s[key];
    else input.value = s[key] === undefined ? "" : s[key];
  }
  checkSchema();
}

function bindSettings() {
  for (const [id, key, kind] of FIELDS) {
    $(id).addEventListener("input", () => {
      const input = $(id);
      const s = current().settings;
      if (kind === "check") s[key] = input.checked;
      else if (kind === "number") s[key] = input.value === "" ? DEFAULTS[key] : Number(input.value);
      else s[key] = input.value;
      save();
      if (key === "schema") checkSchema();
    });
  }
}

// The schema of the reply, parsed, or an error shown beside it.
function checkSchema() {
  const raw = current().settings.schema.trim();
  const err = $("schema-error");
  err.hidden = true;
  if (!raw) return { ok: true, schema: null };
  try {
    const schema = JSON.parse(raw);
    if (typeof schema !== "object" || schema === null) throw new Error("a schema is a JSON object");
    return { ok: true, schema };
  } catch (e) {
    err.textContent = "The schema is not valid JSON: " + e.message;
    err.hidden = false;
    return { ok: false };
  }
}

function setSettings(open) {
  $("settings").hidden = !open;
  $("toggle-settings").setAttribute("aria-expanded", String(open));
}

function setSidebar(open) {
  document.body.classList.toggle("sidebar-open", open);
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
}

// ---- sending ----

function showError(message) {
  const e = $("chat-error");
  e.textContent = message || "";
  e.hidden = !message;
}

function setStreaming(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  document.body.classList.toggle("streaming", on);
}

async function send() {
  if (streaming) return;
  const input = $("composer-input");
  const text = input.value.trim();
  if (!text) return;
  const c = current();
  const schema = checkSchema();
  if (!schema.ok) {
    setSettings(true);
    return;
  }
  showError("");
  if (!model) await loadModel();
  c.messages.push({ role: "user", content: text });
  if (c.title === DEFAULT_TITLE) c.title = text.replace(/\s+/g, " ").slice(0, 40).trim();
  input.value = "";
  const s = c.settings;
  const history = c.messages.filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }));
  const reply = { role: "assistant", content: "", stats: null };
  c.messages.push(reply);
  save();
  renderList();
  renderMessages();
  const body = {
    model,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: s.max_tokens,
    temperature: s.temperature,
    top_p: s.top_p,
    speculation: !!s.speculation,
  };
  let path = "/v1/chat/completions";
  if (s.complete) {
    // The conversation is one text: the system prompt, then every
    // message as written, each reply continuing what came before.
    path = "/v1/completions";
    body.prompt = s.system + history.map((m) => m.content).join("");
  } else {
    body.messages = (s.system.trim() ? [{ role: "system", content: s.system }] : []).concat(history);
  }
  if (String(s.seed).trim() !== "") body.seed = Number(s.seed);
  if (schema.schema) body.response_format = { type: "json_schema", json_schema: { name: "reply", schema: schema.schema } };
  const controller = new AbortController();
  streaming = { conv: c, msg: reply, controller };
  setStreaming(true);
  const started = performance.now();
  let first = null;
  let usage = null;
  try {
    await streamReply(
      path,
      body,
      (chunk) => {
        for (const choice of chunk.choices || []) {
          const thought = choice.delta && choice.delta.reasoning_content;
          if (thought) {
            if (first === null) first = performance.now();
            reply.reasoning = (reply.reasoning || "") + thought;
          }
          const piece = choice.delta ? choice.delta.content : choice.text;
          if (piece) {
            if (first === null) first = performance.now();
            reply.content += piece;
          }
        }
        if (chunk.usage) usage = chunk.usage;
        redrawLast();
      },
      controller.signal,
    );
  } catch (e) {
    if (e.name === "AbortError") reply.stopped = true;
    else reply.error = e instanceof ApiError ? e.message : String(e.message || e);
  }
  const ended = performance.now();
  if (usage && !reply.error) {
    const gen = first === null ? null : (ended - first) / 1000;
    reply.stats = {
      completion_tokens: usage.completion_tokens,
      passes: usage.passes || 0,
      drafted: usage.drafted || 0,
      accepted: usage.accepted || 0,
      // Tokens after the first, over the time after the first.
      tokens_per_second: gen && usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / gen : null,
      first_token_ms: first === null ? null : first - started,
    };
  }
  streaming = null;
  setStreaming(false);
  save();
  if (current() === c) renderMessages();
  $("composer-input").focus();
}

async function loadModel() {
  try {
    const models = await getJson("/v1/models");
    // The chat model comes first (an embedding model may follow).
    model = models.data[0].id;
    $("model-name").textContent = model;
    showError("");
  } catch (e) {
    showError("Cannot list the models: " + e.message);
  }
}

function renderAll() {
  renderList();
  renderMessages();
  renderSettings();
}

function setView(decide) {
  $("chat-view").hidden = decide;
  $("decide-view").hidden = !decide;
  $("tab-chat").setAttribute("aria-pressed", String(!decide));
  $("tab-decide").setAttribute("aria-pressed", String(decide));
}

function init() {
  current();
  renderAll();
  bindSettings();
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("composer-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", () => streaming && streaming.controller.abort());
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && streaming && !document.querySelector("dialog[open]")) streaming.controller.abort();
  });
  $("new-chat").addEventListener("click", () => {
    newConversation();
    renderAll();
    if (window.matchMedia("(max-width: 760px)").matches) setSidebar(false);
    $("composer-input").focus();
  });
  $("toggle-settings").addEventListener("click", () => setSettings($("settings").hidden));
  $("close-settings").addEventListener("click", () => {
    setSettings(false);
    $("toggle-settings").focus();
  });
  $("close-sidebar").addEventListener("click", () => {
    setSidebar(false);
    $("toggle-sidebar").focus();
  });
  $("toggle-sidebar").addEventListener("click", () => setSidebar(!document.body.classList.contains("sidebar-open")));
  $("forget-key").addEventListener("click", () => {
    forgetKey();
    $("forget-key").textContent = "Key forgotten";
  });
  $("tab-chat").addEventListener("click", () => setView(false));
  $("tab-decide").addEventListener("click", () => setView(true));
  initDecide(() => model, loadModel);
  loadModel();
}

init();
