// The dashboard: /metrics read every second (it needs no key), counters
// turned into rates over the last five seconds, drawn as line charts over the
// last two minutes, with acceptance by drafter and by draft position as
// bars and the raw values in a table: the same numbers as /metrics.

import { LineChart, ratioBars } from "/webui/charts.js";

const EVERY_MS = 1000;
const POINTS = 120;
// Rates are over this many readings (5 s), so a request that ends between
// two readings does not draw a spike.
const RATE_OVER = 5;

const $ = (id) => document.getElementById(id);

// Prometheus text: [{name, labels, value}] of every sample line.
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
      let l;
      while ((l = re.exec(m[3])) !== null) labels[l[1]] = l[2];
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

// The sum of a metric's samples whose labels include `match`.
function total(samples, name, match = {}) {
  let sum = 0;
  let seen = false;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(match).some(([k, v]) => s.labels[k] !== v)) continue;
    sum += s.value;
    seen = true;
  }
  return seen ? sum : null;
}

function labelValues(samples, name, label) {
  const seen = [];
  for (const s of samples) if (s.name === name && s.labels[label] !== undefined && !seen.includes(s.labels[label])) seen.push(s.labels[label]);
  return seen;
}

const fixed = (d) => (v) => v.toFixed(d);
const percent = (v) => (100 * v).toFixed(1) + "%";

const charts = {};
// The last readings, oldest first: [{at, samples}].
let history = [];

function makeCharts() {
  const box = $("charts");
  charts.requests = new LineChart(box, "chart-requests", "Requests", [
    { name: "running", className: "s1" },
    { name: "waiting", className: "s2" },
  ], fixed(0), POINTS);
  charts.kv = new LineChart(box, "chart-kv", "KV cache in use", [{ name: "used", className: "s1" }], percent, POINTS);
  charts.tokens = new LineChart(box, "chart-tokens", "Tokens generated per second", [{ name: "tok/s", className: "s1" }], fixed(1), POINTS);
  charts.perPass = new LineChart(box, "chart-per-pass", "Tokens per pass", [{ name: "tokens/pass", className: "s3" }], fixed(2), POINTS);
  charts.acceptance = new LineChart(box, "chart-acceptance", "Drafts accepted", [{ name: "accepted", className: "s3" }], percent, POINTS);
  charts.prefix = new LineChart(box, "chart-prefix", "Prefix-cache hits (prompt tokens)", [{ name: "hits", className: "s2" }], percent, POINTS);
  charts.decisions = new LineChart(box, "chart-decisions", "Decisions per second", [{ name: "decisions/s", className: "s1" }], fixed(2), POINTS);
}

// A counter's rise per second since the reading `prev` (null at the first).
function rate(now, prev, name, seconds) {
  if (!prev) return null;
  const a = total(now, name);
  const b = total(prev, name);
  if (a === null || b === null) return null;
  return Math.max(0, a - b) / seconds;
}

// The ratio of two counters' rises since the reading `prev` (null when the
// second did not rise).
function ratioOfRises(now, prev, num, den) {
  if (!prev) return null;
  const d = (total(now, den) || 0) - (total(prev, den) || 0);
  if (d <= 0) return null;
  return ((total(now, num) || 0) - (total(prev, num) || 0)) / d;
}

function acceptanceBars(samples, drafted, accepted, label, id, name) {
  const rows = labelValues(samples, drafted, label).map((v) => {
    const d = total(samples, drafted, { [label]: v }) || 0;
    const a = total(samples, accepted, { [label]: v }) || 0;
    return { label: name(v), ratio: d > 0 ? a / d : null, note: a + " of " + d };
  });
  ratioBars($(id), rows);
}

const SHOWN = [
  "spindle:num_requests_running",
  "spindle:num_requests_waiting",
  "spindle:kv_cache_usage_perc",
  "spindle:prompt_tokens_total",
  "spindle:generation_tokens_total",
  "spindle:num_forward_passes_total",
  "spindle:spec_decode_num_draft_tokens_total",
  "spindle:spec_decode_num_accepted_tokens_total",
  "spindle:prefix_cache_queries_total",
  "spindle:prefix_cache_hits_total",
  "spindle:request_success_total",
  "spindle:request_cancelled_total",
  "spindle:request_failed_total",
  "spindle:decide_requests_total",
  "spindle:decide_questions_total",
  "spindle:num_preemptions_total",
];

function counters(samples) {
  const body = $("counters").tBodies[0];
  body.replaceChildren(
    ...SHOWN.map((name) => {
      const tr = document.createElement("tr");
      const k = document.createElement("td");
      k.textContent = name;
      const v = document.createElement("td");
      const t = total(samples, name);
      v.textContent = t === null ? "–" : String(t);
      v.dataset.metric = name;
      tr.append(k, v);
      return tr;
    }),
  );
}

async function tick() {
  const at = performance.now();
  let text;
  try {
    const resp = await fetch("/metrics", { cache: "no-store" });
    if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
    text = await resp.text();
  } catch (e) {
    $("status").textContent = "cannot read /metrics: " + e.message;
    $("status").classList.add("error");
    history = [];
    return;
  }
  const samples = parseMetrics(text);
  const oldest = history.length ? history[0] : null;
  const seconds = oldest ? (at - oldest.at) / 1000 : 1;
  const prev = oldest && oldest.samples;
  const model = samples.find((s) => s.labels.model_name);
  if (model) $("model-name").textContent = model.labels.model_name;
  charts.requests.push([total(samples, "spindle:num_requests_running"), total(samples, "spindle:num_requests_waiting")]);
  charts.kv.push([total(samples, "spindle:kv_cache_usage_perc")]);
  charts.tokens.push([rate(samples, prev, "spindle:generation_tokens_total", seconds)]);
  charts.perPass.push([ratioOfRises(samples, prev, "spindle:generation_tokens_total", "spindle:num_forward_passes_total")]);
  charts.acceptance.push([ratioOfRises(samples, prev, "spindle:spec_decode_num_accepted_tokens_total", "spindle:spec_decode_num_draft_tokens_total")]);
  charts.prefix.push([ratioOfRises(samples, prev, "spindle:prefix_cache_hits_total", "spindle:prefix_cache_queries_total")]);
  charts.decisions.push([rate(samples, prev, "spindle:decide_requests_total", seconds)]);
  acceptanceBars(samples, "spindle:spec_decode_num_draft_tokens_by_source_total", "spindle:spec_decode_num_accepted_tokens_by_source_total", "source", "by-source", (v) => v);
  acceptanceBars(samples, "spindle:spec_decode_num_draft_tokens_per_pos_total", "spindle:spec_decode_num_accepted_tokens_per_pos_total", "position", "by-position", (v) => "position " + v);
  counters(samples);
  history.push({ at, samples });
  if (history.length > RATE_OVER) history.shift();
  $("status").textContent = "updated " + new Date().toLocaleTimeString();
  $("status").classList.remove("error");
  document.body.dataset.ticks = String(Number(document.body.dataset.ticks || 0) + 1);
}

makeCharts();
tick();
setInterval(tick, EVERY_MS);
