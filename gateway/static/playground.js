// Cascade playground: streams a request with "cascade_rounds": true and draws each round's tokens
// by origin. Plain browser JavaScript, no build step, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const NUMBER_FIELDS = ["max_tokens", "num_draft_tokens", "draft_tree_nodes", "temperature", "top_p",
  "cascade_alpha"];
const CHOICE_FIELDS = ["draft_schedule", "draft_method", "acceptance", "cascade_rule"];
let modelName = null;

async function loadSettings() {
  const response = await fetch("settings.json");
  const settings = await response.json();
  modelName = settings.model;
  $("model-name").textContent = settings.model;
  $("num_draft_tokens").value = settings.default_num_draft_tokens;
  $("num_draft_tokens").max = settings.max_draft_tokens;
  $("max_tokens").max = settings.max_tokens_limit;
  fillSelect($("draft_method"), settings.draft_methods, settings.default_draft_method);
  fillSelect($("cascade_rule"), settings.cascade_rules, settings.cascade_rules[0]);
}

function fillSelect(select, values, chosen) {
  select.replaceChildren(...values.map((value) => new Option(value, value, false, value === chosen)));
}

function requestBody(overrides) {
  const body = { model: modelName, stream: true, cascade_rounds: true };
  for (const name of NUMBER_FIELDS) {
    const raw = $(name).value.trim();
    if (raw !== "") body[name] = Number(raw);
  }
  for (const name of CHOICE_FIELDS) body[name] = $(name).value;
  if (body.acceptance !== "cascade") { delete body.cascade_rule; delete body.cascade_alpha; }
  const prompt = $("prompt").value;
  if ($("mode").value === "chat") body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  return Object.assign(body, overrides);
}

function endpoint() {
  return $("mode").value === "chat" ? "/v1/chat/completions" : "/v1/completions";
}

// The data of each server-sent event, as the stream delivers it.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `HTTP ${response.status} ${response.statusText}`;
}

// What a figure means, where a number alone does not say (shown on hover).
const FIGURE_NOTES = {
  "rounds at 0 drafts": "Rounds the verifier decoded alone: with draft schedule auto the goodput " +
    "planner measured that drafting would not pay at the verifier's load, a drafted block was " +
    "still on its way, or the draft method found nothing to propose. Draft schedule fixed " +
    "drafts every round.",
};

// One run's output, figures and chart in its pane.
class Pane {
  constructor(element) {
    this.element = element;
    this.output = element.querySelector(".output");
    this.figures = element.querySelector(".figures");
    this.chart = element.querySelector(".chart");
    this.reset();
  }

  reset() {
    this.rounds = [];
    this.tokens = 0;
    this.accepted = 0;
    this.drafted = 0;
    this.ttftMs = null;
    this.elapsedMs = 0;
    this.output.replaceChildren();
    this.chart.replaceChildren();
    this.showFigures();
  }

  addRound(round, elapsedMs) {
    this.rounds.push(round);
    this.tokens += round.tokens.length;
    this.accepted += round.num_accepted;
    this.drafted += round.num_drafted;
    this.elapsedMs = elapsedMs;
    if (this.ttftMs === null && round.tokens.length > 0) this.ttftMs = elapsedMs;
    this.output.append(roundElement(round));
    this.showFigures();
    this.drawChart();
  }

  get tokensPerSecond() {
    return this.elapsedMs > 0 ? (1000 * this.tokens) / this.elapsedMs : 0;
  }

  showFigures() {
    const n = this.rounds.length;
    const figures = {
      "tokens": this.tokens,
      "rounds": n,
      "tokens/s": this.tokensPerSecond.toFixed(1),
      "acceptance rate": this.drafted ? (this.accepted / this.drafted).toFixed(2) : "–",
      "mean accepted length": n ? (this.tokens / n).toFixed(2) : "–",
      "mean verified draft": n ? (this.drafted / n).toFixed(2) : "–",
      "rounds at 0 drafts": n ? `${Math.round((100 * this.rounds.filter((r) => !r.num_drafted).length) / n)} %` : "–",
      "rounds from memory": n ? `${Math.round((100 * this.rounds.filter((r) => r.draft_source === "memory").length) / n)} %` : "–",
      "time to first token": this.ttftMs === null ? "–" : `${Math.round(this.ttftMs)} ms`,
    };
    this.figures.replaceChildren(...Object.entries(figures).map(([name, value]) => {
      const item = document.createElement("div");
      item.dataset.figure = name;
      if (FIGURE_NOTES[name]) item.title = FIGURE_NOTES[name];
      const term = document.createElement("dt");
      term.textContent = name;
      const detail = document.createElement("dd");
      detail.textContent = value;
      item.append(term, detail);
      return item;
    }));
  }

  // Tokens committed per round (y) against the round (x), with axes: the accepted part in the
  // accepted colour, the verifier's own token in another, rounds decoded alone in grey (the
  // legend under the chart names them).
  drawChart() {
    const svgNs = "http://www.w3.org/2000/svg";
    const height = 96, left = 30, bottom = 18, top = 4;
    const tallest = Math.max(2, ...this.rounds.map((r) => Math.max(r.tokens.length, r.num_drafted + 1)));
    const width = Math.max(left + 1, this.chart.clientWidth || 600);
    const plot = height - bottom - top;
    const step = Math.min(14, (width - left) / Math.max(1, this.rounds.length));
    const unit = plot / tallest;
    this.chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const node = (name, attributes, text) => {
      const element = document.createElementNS(svgNs, name);
      for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
      if (text !== undefined) element.textContent = text;
      return element;
    };
    const baseline = height - bottom;
    const parts = [
      node("line", { class: "axis", x1: left, y1: top, x2: left, y2: baseline }),
      node("line", { class: "axis", x1: left, y1: baseline, x2: width, y2: baseline }),
      node("text", { class: "tick", x: left - 4, y: baseline, "text-anchor": "end" }, "0"),
      node("text", { class: "tick", x: left - 4, y: top + 8, "text-anchor": "end" }, String(tallest)),
      node("text", { class: "axis-label", x: 2, y: top + plot / 2 + 4 }, "tok"),
      node("text", { class: "axis-label", x: width - 2, y: height - 2, "text-anchor": "end" },
           `round (1-${this.rounds.length})`),
    ];
    this.rounds.forEach((round, i) => {
      const accepted = round.num_accepted;
      const other = round.tokens.length - accepted;
      const x = left + 1 + i * step;
      const bar = (cls, count, below) => node("rect", {
        class: cls, x, width: Math.max(1, step - 1),
        y: baseline - (below + count) * unit, height: count * unit,
      });
      const otherClass = round.num_drafted ? "bar-other" : "bar-target";
      if (accepted) parts.push(bar("bar-accepted", accepted, 0));
      if (other) parts.push(bar(otherClass, other, accepted));
    });
    this.chart.replaceChildren(...parts);
  }
}

function roundElement(round) {
  const element = document.createElement("span");
  element.className = "round";
  element.tabIndex = 0;
  element.dataset.round = round.round;
  for (const token of round.tokens) {
    const span = document.createElement("span");
    span.className = `tok ${token.kind}`;
    span.textContent = token.text;
    element.append(span);
  }
  const describe = () => showRoundInfo(element, round);
  element.addEventListener("mouseenter", describe);
  element.addEventListener("focus", describe);
  element.addEventListener("mouseleave", hideRoundInfo);
  element.addEventListener("blur", hideRoundInfo);
  return element;
}

function visible(text) {
  return JSON.stringify(text).slice(1, -1);
}

const BLOCK_ORIGINS = {
  lock_step: "drafted after the previous verdict",
  miss: "drafted after the previous verdict (no pre-draft guessed it)",
  cache_hit: "pre-drafted during the previous verification, sent at its verdict",
  ahead_hit: "pre-drafted and sent ahead: verified right after the previous verdict",
};

const SOURCES = {
  model: "the drafter model",
  ngram: "prompt lookup",
  suffix: "the session's own tokens (suffix)",
  memory: "the speculation memory",
};

function showRoundInfo(element, round) {
  document.querySelectorAll(".round.active").forEach((e) => e.classList.remove("active"));
  element.classList.add("active");
  const info = $("round-info");
  const drafted = round.drafted.length
    ? round.drafted.map((t) => `<code>${escapeHtml(visible(t))}</code>`).join(" ")
    : "none (the target decoded alone)";
  const own = round.tokens.filter((t) => t.kind !== "filled");
  const last = own[own.length - 1];
  const verifierToken = last && last.kind !== "accepted"
    ? `<br>verifier's token (${last.kind}): <code>${escapeHtml(visible(last.text))}</code>` : "";
  info.innerHTML = `<strong>Round ${round.round}</strong><br>drafted: ${drafted}${treeInfo(round)}` +
    `<br>accepted ${round.num_accepted} of ${round.num_drafted}${verifierToken}` +
    (round.num_filled ? `<br>filled in (forced by the grammar): ${round.num_filled}` : "") +
    `<br>draft ${round.draft_ms.toFixed(1)} ms · verify ${round.verify_ms.toFixed(1)} ms` +
    ` · round ${round.round_ms.toFixed(1)} ms<br>block: ${BLOCK_ORIGINS[round.block] || round.block}` +
    (round.draft_source ? ` · drafted by: ${escapeHtml(SOURCES[round.draft_source] || round.draft_source)}` : "");
  info.hidden = false;
}

function treeInfo(round) {
  // A token tree: each node's parent, and the branch the verifier took (node indices).
  if (!round.parents || !round.parents.length) return "";
  const label = (i) => `<code>${escapeHtml(visible(round.drafted[i]))}</code>`;
  const roots = round.parents.filter((p) => p < 0).length;
  const taken = round.path.length ? round.path.map(label).join(" → ") : "none of its branches";
  return `<br>a tree of ${round.parents.length} nodes (${roots} first candidates); ` +
    `branch taken: ${taken}`;
}

function hideRoundInfo() {
  document.querySelectorAll(".round.active").forEach((e) => e.classList.remove("active"));
  $("round-info").hidden = true;
}

function escapeHtml(text) {
  const div = document.createElement("div");
  div.textContent = text;
  return div.innerHTML;
}

async function stream(pane, body) {
  pane.reset();
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const started = performance.now();
  const response = await fetch(endpoint(), { method: "POST", headers, body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await errorMessage(response));
  for await (const data of sseData(response)) {
    if (data === "[DONE]") break;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.cascade) pane.addRound(chunk.cascade, performance.now() - started);
  }
  pane.element.dataset.done = "true";
  return pane;
}

let panes = null;

function setBusy(busy, text) {
  $("run").disabled = busy;
  $("compare").disabled = busy;
  $("status").textContent = text;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function run(compare) {
  showError("");
  $("speedup").hidden = true;
  $("panes").classList.toggle("compare", compare);
  panes.target.element.hidden = !compare;
  for (const pane of [panes.speculative, panes.target]) delete pane.element.dataset.done;
  try {
    setBusy(true, "Running…");
    const fast = await stream(panes.speculative, requestBody({}));
    if (compare) {
      setBusy(true, "Running the same request on the target alone…");
      const slow = await stream(panes.target, requestBody({ num_draft_tokens: 0 }));
      showSpeedup(fast, slow);
    }
    setBusy(false, "Done.");
  } catch (error) {
    showError(error.message);
    setBusy(false, "Failed.");
  }
}

function showSpeedup(fast, slow) {
  const element = $("speedup");
  const ratio = slow.tokensPerSecond > 0 ? fast.tokensPerSecond / slow.tokensPerSecond : 0;
  element.dataset.speedup = ratio.toFixed(3);
  element.textContent = `Speedup over the target alone: ${ratio.toFixed(2)}× ` +
    `(${fast.tokensPerSecond.toFixed(1)} vs ${slow.tokensPerSecond.toFixed(1)} tokens/s)`;
  element.hidden = false;
}

window.addEventListener("DOMContentLoaded", async () => {
  panes = { speculative: new Pane($("pane-speculative")), target: new Pane($("pane-target")) };
  $("request-form").addEventListener("submit", (event) => { event.preventDefault(); run(false); });
  $("compare").addEventListener("click", () => run(true));
  try {
    await loadSettings();
    document.body.dataset.ready = "true";
  } catch (error) {
    showError(`Could not load the gateway's settings: ${error.message}`);
  }
});
