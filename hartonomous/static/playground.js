// Hartonomous playground: streams the chosen paths (one pane each, as the server declares them)
// side by side over SSE (fetch + POST, parsed here, since EventSource cannot POST), colours each
// token of the speculative and hybrid panes by where it came from (on the speculative pane, a kept
// draft also by the source of the atom that voted for it most) and each token of the augmented
// pane by λ, the store's weight at its step, and draws the spatial distribution of the latest step.
"use strict";

const $ = (id) => document.getElementById(id);
const NUMBER_FIELDS = ["max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty"];
const TOP_N = 12;
// The paths are the server's (hartonomous/paths/, rendered into the page as one pane each).
const PATHS = [...document.querySelectorAll(".pane")].map((pane) => pane.dataset.path);
// Where a token came from, per path: the stream event's field and the words for its tooltip.
const ORIGIN = {
  speculative: { field: "origin", words: { draft: "drafted by the spatial path, kept by the exact model",
                                           exact: "the exact model's own (a correction or a plain step)" } },
  hybrid: { field: "route", words: { spatial: "answered by the spatial path (risk below the threshold)",
                                     exact: "answered by the exact model (risk at or above the threshold)" } },
};
// A kept draft's source (the stream's `source`, asked for with `sources: true`): the atom that voted for it most.
const SOURCE_WORDS = {
  corpus: "an atom of the corpus",
  "self-distilled": "an atom of the model's own self-distilled text",
  memory: "the memory of past generations",
  context: "the context's own earlier text (a history atom)",
};
let running = [];   // AbortControllers of the streams in flight

// ---- SSE over fetch --------------------------------------------------------------------

function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;          // comments are keep-alive pings
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}

async function streamEvents(body, signal, onEvent) {
  const response = await fetch("/api/generate/stream", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
  });
  if (!response.ok) {
    const err = await response.json().catch(() => ({ error: response.statusText }));
    throw new Error(`${response.status}: ${err.error || response.statusText}`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer = (buffer + value).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const parsed = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (parsed && onEvent(parsed) === false) { reader.cancel(); return; }
    }
  }
}

// ---- panes -----------------------------------------------------------------------------

function pane(path) {
  const root = $(`pane-${path}`);
  const q = (sel) => root.querySelector(sel);
  let tokens = 0, seconds = 0, started = 0;
  const show = () => {
    q(".count").textContent = `${tokens} token${tokens === 1 ? "" : "s"}`;
    const rate = seconds > 0 ? tokens / seconds : (tokens && started ? tokens / ((performance.now() - started) / 1000) : 0);
    q(".rate").textContent = rate ? `${rate.toFixed(1)} tokens/s` : "– tokens/s";
    root.dataset.tokens = String(tokens);
  };
  return {
    reset(prompt) {
      tokens = 0; seconds = 0; started = performance.now();
      q(".prompt-echo").textContent = prompt;
      q(".generated").textContent = "";
      if (q(".spec-stats")) q(".spec-stats").textContent = "";
      this.state("starting");
      show();
    },
    state(text, kind) {
      root.dataset.state = kind || text;
      q(".state").textContent = text;
    },
    token(event) {
      if ("token_id" in event) tokens += 1;        // a final text-only event flushes held-back text
      if (typeof event.seconds === "number") seconds += event.seconds;
      const origin = ORIGIN[path] && event[ORIGIN[path].field];
      if (typeof event.weight === "number") {    // augmented: tinted by λ, underlined when the store's top won
        const span = document.createElement("span");
        span.className = `tok tok-weight${event.store_top ? " store-top" : ""}`;
        span.style.setProperty("--weight", String(event.weight));
        span.dataset.weight = String(event.weight);
        span.title = `λ = ${event.weight.toFixed(3)}` +
          (event.store_top ? "; the store's most probable token" : "");
        span.textContent = event.token;
        q(".generated").appendChild(span);
      } else if (origin) {                                // coloured by where the token came from
        const span = document.createElement("span");
        span.className = `tok tok-${origin}`;
        span.dataset.origin = origin;
        span.title = ORIGIN[path].words[origin] || origin;
        if (event.source) {                        // a kept draft: coloured by its atom's source too
          span.classList.add(`src-${event.source}`);
          span.dataset.source = event.source;
          span.title += `; from ${SOURCE_WORDS[event.source] || event.source}`;
        }
        span.textContent = event.token;
        q(".generated").appendChild(span);
      } else if (event.citations) {                 // a cited token on an uncoloured pane
        const span = document.createElement("span");
        span.className = "tok";
        span.textContent = event.token;
        q(".generated").appendChild(span);
      } else {
        q(".generated").append(event.token);
      }
      if (event.citations) citeOnHover(q(".generated").lastChild, event.citations);
      if (event.live && q(".spec-stats")) {
        const l = event.live;
        q(".spec-stats").textContent = `live: acceptance ${l.acceptance_rate === null ? "n/a" : l.acceptance_rate.toFixed(2)}` +
          ` · ${l.tokens_per_forward === null ? "n/a" : l.tokens_per_forward.toFixed(2)} tokens/forward · ${l.rounds} rounds`;
      }
      const out = q(".output");
      out.scrollTop = out.scrollHeight;
      show();
    },
    result(result) {
      if (result.timings && result.timings.tokens_per_second) {
        q(".rate").textContent = `${result.timings.tokens_per_second.toFixed(1)} tokens/s`;
      }
      this.state(`${result.state} (${result.finish_reason}) · seed ${result.seed}`, "done");
      const s = result.stats;
      const box = q(".spec-stats");
      if (s && box && path === "augmented") {
        const mean = s.mean_weight === null ? "n/a" : s.mean_weight.toFixed(3);
        box.textContent = `mean λ ${mean} over ${s.steps} steps · the store's most probable token picked ` +
          `${s.store_top_picked}/${s.steps}`;
      } else if (s && box && path === "hybrid") {
        box.textContent = `${s.exact_steps} of ${s.steps} steps exact (${(100 * s.exact_fraction).toFixed(0)}%) · ` +
          `risk threshold ${s.threshold}`;
      } else if (s && box) {
        const rate = s.acceptance_rate === null ? "n/a" : s.acceptance_rate.toFixed(2);
        const perForward = s.tokens_per_forward === null ? "n/a" : s.tokens_per_forward.toFixed(2);
        box.textContent = `${s.rounds} rounds · acceptance ${rate} (${s.accepted}/${s.drafted}) · ` +
          `${perForward} tokens/forward · draft ${s.draft_s.toFixed(2)} s, verify ${s.verify_s.toFixed(2)} s`;
      }
    },
  };
}

// ---- the distribution chart ------------------------------------------------------------

function visible(text) {
  return JSON.stringify(text).slice(1, -1).replace(/ /g, "\u2423");
}

function drawChart(rows, chosen, step) {
  const chosenId = chosen ? chosen.token_id : null;
  const svg = $("chart");
  const ns = "http://www.w3.org/2000/svg";
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const width = svg.clientWidth || 900, rowH = 22, labelW = 190, valueW = 70;
  const add = (tag, attrs, text) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.appendChild(el);
    return el;
  };
  if (!rows || !rows.length) {
    svg.setAttribute("height", 40);
    add("text", { x: 8, y: 24, class: "empty" }, "no distribution yet: generate on the spatial path");
    return;
  }
  svg.setAttribute("height", rows.length * rowH + 8);
  const max = Math.max(...rows.map((r) => r.probability));
  const barW = Math.max(40, width - labelW - valueW - 16);
  rows.forEach((r, i) => {
    const y = 4 + i * rowH;
    const label = add("text", { x: labelW - 8, y: y + 15, "text-anchor": "end" }, `${visible(r.text)}  #${r.token_id}`);
    label.appendChild(document.createElementNS(ns, "title")).textContent = `token ${r.token_id}: ${JSON.stringify(r.text)}`;
    add("rect", { x: labelW, y: y + 3, height: rowH - 6, width: Math.max(1, (r.probability / max) * barW),
                  class: r.token_id === chosenId ? "bar chosen" : "bar" });
    add("text", { x: labelW + barW + 8, y: y + 15 }, r.probability.toFixed(3));
  });
  const picked = chosen ? `picked #${chosen.token_id} (p = ${(chosen.probability ?? 0).toFixed(3)})` : "";
  const where = rows.some((r) => r.token_id === chosenId) ? "dark bar" : `not among the top ${rows.length}`;
  $("chart-caption").textContent = `step ${step}: the ${rows.length} most likely tokens; ${picked}, ${where}`;
}

// A store-picked token's sources (`citations`, asked for with `cite: true`), shown on hover:
// file:line (license) or the remembered generation.
function citeOnHover(span, citations) {
  const lines = citations.map((c) => c.kind === "memory"
    ? `memory: generation ${c.generation}, step ${c.step}`
    : `${c.path}:${c.line}${c.license ? ` (${c.license})` : ""}`);
  span.classList.add("cited");
  span.dataset.citations = lines.join("\n");
  span.title = (span.title ? `${span.title}\n` : "") + lines.join("\n");
}

// ---- controls --------------------------------------------------------------------------

function requestBody() {
  const body = { prompt: $("prompt").value, details: true, top_n: TOP_N };
  for (const name of NUMBER_FIELDS) body[name] = Number($(name).value);
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("atom_set").value) body.atom_set = $("atom_set").value;
  if ($("cite").checked) body.cite = true;
  return body;
}

async function run(path, body) {
  const p = pane(path);
  const controller = new AbortController();
  running.push(controller);
  p.reset(body.prompt);
  try {
    p.state("streaming");
    const request = path === "speculative" ? { ...body, path, sources: true } : { ...body, path };
    if (path === "exact") delete request.cite;          // the exact path reads no store
    await streamEvents(request, controller.signal, ({ event, data }) => {
      if (event === "message" && data === "[DONE]") return false;
      const payload = JSON.parse(data);
      if (event === "error") throw new Error(payload.error);
      if (event === "result") { p.result(payload); return true; }
      p.token(payload);
      if (path === "spatial" && payload.distribution) drawChart(payload.distribution, payload, payload.step);
      return true;
    });
    if ($(`pane-${path}`).dataset.state !== "done") p.state("done");
  } catch (err) {
    if (err.name === "AbortError") p.state("stopped", "done");
    else p.state(`error: ${err.message}`, "error");
  } finally {
    running = running.filter((c) => c !== controller);
  }
}

async function generate(ev) {
  if (ev) ev.preventDefault();
  stop();
  const body = requestBody();
  const paths = PATHS.filter((p) => $(`use-${p}`).checked);
  for (const p of PATHS) $(`pane-${p}`).hidden = !$(`use-${p}`).checked;
  $("generate").disabled = true;
  $("stop").disabled = false;
  await Promise.all(paths.map((p) => run(p, body)));
  $("generate").disabled = false;
  $("stop").disabled = true;
}

function stop() {
  for (const c of running) c.abort();
  running = [];
}

// The panes ticked at start are the declared ones (exact, augmented, speculative) that the default set
// serves: on a set without corpus labels and a gate the augmented pane waits, unticked, with spatial.
function tickServed(set) {
  if (!set || !set.paths) return;
  for (const p of PATHS) {
    if (set.paths.includes(p)) continue;
    $(`use-${p}`).checked = false;
    $(`pane-${p}`).hidden = true;
  }
}

async function loadInfo() {
  try {
    const health = await (await fetch("/healthz")).json();
    const badge = $("health");
    badge.textContent = health.status === "ok"
      ? `database ok · ${health.atom_sets} atom set(s) · exact model ${health.exact_model}`
      : `database ${health.database}`;
    badge.className = `badge ${health.status === "ok" ? "ok" : "bad"}`;
    const sets = await (await fetch("/api/atom_sets")).json();
    for (const s of sets.atom_sets || []) {
      const option = document.createElement("option");
      option.value = s.name;
      option.textContent = `${s.name} (${s.kind}${s.is_default ? ", default" : ""})`;
      $("atom_set").appendChild(option);
    }
    tickServed((sets.atom_sets || []).find((s) => s.name === sets.default));
  } catch (err) {
    $("health").textContent = `server unreachable: ${err.message}`;
    $("health").className = "badge bad";
  }
}

$("controls").addEventListener("submit", generate);
$("stop").addEventListener("click", stop);
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) generate(ev);
});
drawChart([], null, 0);
loadInfo();
