// The decision playground: a state, a question and its options, answered
// by /v1/decide (every option's probability from one pass), shown as bars.

import { postJson } from "/webui/api.js";

const $ = (id) => document.getElementById(id);

function bar(label, p, selected) {
  const row = document.createElement("div");
  row.className = "bar-row" + (selected ? " selected" : "");
  row.dataset.option = label;
  row.dataset.probability = String(p);
  const name = document.createElement("span");
  name.className = "bar-label";
  name.textContent = label;
  const track = document.createElement("span");
  track.className = "bar-track";
  track.setAttribute("role", "meter");
  track.setAttribute("aria-valuemin", "0");
  track.setAttribute("aria-valuemax", "1");
  track.setAttribute("aria-valuenow", String(p));
  track.setAttribute("aria-label", label);
  const fill = document.createElement("span");
  fill.className = "bar-fill";
  fill.style.width = (100 * p).toFixed(1) + "%";
  track.appendChild(fill);
  const value = document.createElement("span");
  value.className = "bar-value";
  value.textContent = (100 * p).toFixed(1) + "%";
  row.append(name, track, value);
  return row;
}

function show(answer, ms) {
  const out = $("decide-result");
  const head = document.createElement("p");
  head.className = "decide-head";
  head.textContent = "Selected: " + answer.selected + " (confidence " + (100 * answer.confidence).toFixed(1) + "%)";
  const bars = document.createElement("div");
  bars.className = "bars";
  const probs = answer.probabilities;
  for (const label of Object.keys(probs)) bars.appendChild(bar(label, probs[label], label === answer.selected));
  const foot = document.createElement("p");
  foot.className = "stats";
  foot.textContent = "answered in " + Math.round(ms) + " ms";
  out.replaceChildren(head, bars, foot);
}

export function initDecide(model, loadModel) {
  const kind = $("decide-kind");
  const options = $("decide-options");
  const syncKind = () => {
    const yesNo = kind.value === "yes_no";
    options.disabled = yesNo;
    $("decide-options").previousElementSibling.classList.toggle("disabled", yesNo);
  };
  kind.addEventListener("change", syncKind);
  syncKind();
  $("decide-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const err = $("decide-error");
    err.hidden = true;
    if (!model()) await loadModel();
    const question = { id: "answer", kind: kind.value };
    const q = $("decide-question").value.trim();
    if (q) question.question = q;
    if (kind.value !== "yes_no") {
      question.options = options.value
        .split("\n")
        .map((s) => s.trim())
        .filter((s) => s);
    }
    const button = $("decide-ask");
    button.disabled = true;
    const started = performance.now();
    try {
      const r = await postJson("/v1/decide", {
        model: model(),
        state: $("decide-state").value,
        questions: [question],
      });
      show(r.questions[0], performance.now() - started);
    } catch (x) {
      err.textContent = x.message;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
}
