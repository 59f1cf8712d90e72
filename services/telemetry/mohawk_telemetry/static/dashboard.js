// Mohawk dashboard: loads one ClusterSnapshot from /api/state, then follows the `snapshot` events of
// /api/events and redraws the page from each one (header, pipeline chains, charts, shares, latency,
// security rejections). The snapshot's fields are those of mohawk_telemetry/snapshot.py; strings from
// the cluster only ever reach the page as text nodes, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

// el("div", {class: "x", "data-node-id": id}, child, "text", ...): a new element.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fixed(value, digits = 1) {
  return Number.isFinite(value) ? value.toFixed(digits) : "—";
}

function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = value, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
}

function pct(share) {
  return Math.round(Math.max(0, Math.min(1, share)) * 100) + "%";
}

// A thin bar showing used/total; amber past 90 %.
function meter(used, total) {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  return el("div", {class: share > 0.9 ? "meter high" : "meter"},
    el("i", {style: `width: ${(share * 100).toFixed(1)}%`}));
}

function row(label, value) {
  return el("div", {class: "row"}, el("span", {}, label), el("span", {}, value));
}

function rejectionText(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n > 0);
  if (entries.length === 0) return "none";
  return entries.map(([reason, n]) => `${reason} ${n}`).join(", ");
}

// ---- header ----------------------------------------------------------------------------------

function renderHeader(snap) {
  const plan = snap.plan;
  $("model").textContent = snap.model || "—";
  $("plan-version").textContent = plan.version > 0 ? String(plan.version) : "—";
  const state = $("plan-state");
  state.textContent = plan.state || "no plan";
  state.className = "badge " + (plan.state || "");
  $("leader").textContent = plan.leader || "none";
  $("updated").textContent = new Date(snap.time * 1000).toLocaleTimeString();
}

function setConnection(state) {
  const conn = $("connection");
  conn.textContent = state;
  conn.className = "conn " + state;
}

// ---- nodes: pipelines as chains, then spares, quarantined and unplaced nodes ----------------

// One node's box. `stage` (from the plan) overrides the layer range the node reports, and `view`
// is absent when the plan names a node that sends no heartbeat.
function nodeBox(nodeId, view, stage, role) {
  const up = Boolean(view && view.up);
  const classes = ["node", up ? "up" : "down"];
  if (role === "quarantined") classes.push("quarantined");
  const badge = role === "quarantined" ? "quarantined" : (up ? "up" : "down");
  const box = el("div", {class: classes.join(" "), "data-node-id": nodeId},
    el("div", {class: "node-head"},
      el("span", {class: "node-id"}, nodeId),
      el("span", {class: "badge " + badge}, badge)));
  if (stage) {
    box.append(row(`stage ${stage.stage}`, `layers [${stage.start}, ${stage.end})`));
  } else if (view && view.loaded && view.end > view.start) {
    box.append(row(role, `layers [${view.start}, ${view.end})`));
  } else {
    box.append(row(role, "no layers"));
  }
  if (!view) {
    box.append(el("div", {class: "muted"}, "no heartbeat"));
    return box;
  }
  box.append(
    row(view.device || "?", view.backend + (view.weights_format ? " · " + view.weights_format : "")),
    row("memory", view.memory_limit_bytes > 0
      ? `${bytes(view.memory_used_bytes)} / ${bytes(view.memory_limit_bytes)}`
      : bytes(view.memory_used_bytes)),
    meter(view.memory_used_bytes, view.memory_limit_bytes),
    row("KV blocks", `${view.kv_blocks_used} / ${view.kv_blocks_total}`),
    meter(view.kv_blocks_used, view.kv_blocks_total),
    row("tokens/s", fixed(view.tokens_per_s)),
  );
  if (view.stage === 0) box.append(row("queue · running", `${view.queue_depth} · ${view.running}`));
  if (view.hop_ms_p50 > 0) box.append(row("hop p50 / p99", `${fixed(view.hop_ms_p50)} / ${fixed(view.hop_ms_p99)} ms`));
  const rejections = rejectionText(view.security_rejections);
  box.append(el("div", {class: rejections === "none" ? "rejections" : "rejections some"},
    "rejections: " + rejections));
  return box;
}

function renderNodes(snap) {
  const byId = new Map(snap.nodes.map((n) => [n.node_id, n]));
  const shown = new Set();
  const groups = [];
  for (const pipe of snap.plan.pipelines) {
    const chain = el("div", {class: "chain"});
    const stages = [...pipe.stages].sort((a, b) => a.stage - b.stage);
    stages.forEach((stage, i) => {
      if (i > 0) chain.append(el("span", {class: "arrow"}, "→"));
      chain.append(nodeBox(stage.node_id, byId.get(stage.node_id), stage, "stage"));
      shown.add(stage.node_id);
    });
    groups.push(el("div", {class: "pipeline", "data-pipeline-id": pipe.id},
      el("h3", {class: "pipeline-head"},
        el("span", {}, `pipeline ${pipe.id}`),
        el("span", {}, `epoch ${pipe.epoch}`),
        el("span", {class: "badge " + (pipe.active ? "active" : "loading")}, pipe.active ? "active" : "inactive"),
        el("span", {}, `${fixed(pipe.tokens_per_s)} tok/s`)),
      chain));
  }
  const apart = (title, ids, role) => {
    const fresh = ids.filter((id) => !shown.has(id));
    if (fresh.length === 0) return;
    fresh.forEach((id) => shown.add(id));
    groups.push(el("div", {class: "group"}, el("h3", {}, title),
      el("div", {class: "chain"}, fresh.map((id) => nodeBox(id, byId.get(id), null, role)))));
  };
  apart("quarantined", snap.plan.quarantined, "quarantined");
  apart("spares", snap.plan.spares, "spare");
  apart("not in the plan", snap.nodes.map((n) => n.node_id), "unplaced");
  if (groups.length === 0) groups.push(el("p", {class: "muted"}, "no nodes reported yet"));
  $("nodes").replaceChildren(...groups);
}

// ---- busy and bubble shares ------------------------------------------------------------------

function renderShares(snap) {
  const byId = new Map(snap.nodes.map((n) => [n.node_id, n]));
  const blocks = [];
  for (const pipe of snap.plan.pipelines) {
    const rows = [...pipe.stages].sort((a, b) => a.stage - b.stage).map((stage) => {
      const view = byId.get(stage.node_id) || {busy_share: 0, bubble_share: 0};
      const busy = Math.max(0, Math.min(1, view.busy_share));
      const bubble = Math.max(0, Math.min(1 - busy, view.bubble_share));
      return el("div", {class: "share-row"},
        el("span", {class: "label", title: stage.node_id}, `${stage.stage} · ${stage.node_id}`),
        el("div", {class: "share-bar"},
          el("i", {class: "busy", style: `width: ${busy * 100}%`}),
          el("i", {class: "bubble", style: `width: ${bubble * 100}%`})),
        el("span", {class: "value"}, `${pct(view.busy_share)} · ${pct(view.bubble_share)}`));
    });
    blocks.push(el("h3", {}, `pipeline ${pipe.id}`), ...rows);
  }
  if (blocks.length === 0) blocks.push(el("p", {class: "muted"}, "no pipelines"));
  $("shares").replaceChildren(...blocks);
}

// ---- latency and security --------------------------------------------------------------------

function renderLatency(snap) {
  const line = (label, p) => el("tr", {},
    el("td", {}, label), el("td", {}, fixed(p.p50)), el("td", {}, fixed(p.p95)),
    el("td", {}, fixed(p.p99)), el("td", {}, String(p.count)));
  $("latency").replaceChildren(line("time to first token", snap.ttft_ms), line("inter-token", snap.itl_ms));
}

function renderRejections(snap) {
  const entries = Object.entries(snap.security_rejections || {})
    .filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
  const total = entries.reduce((sum, [, n]) => sum + n, 0);
  $("rejections-total").textContent = String(total);
  const items = entries.map(([reason, n]) => el("li", {}, el("span", {}, reason), el("span", {}, String(n))));
  if (items.length === 0) items.push(el("li", {class: "none"}, "none"));
  $("rejections").replaceChildren(...items);
}

// ---- line charts -----------------------------------------------------------------------------

// A round upper bound for the y axis: 1, 2 or 5 times a power of ten.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

// Draws `values` against unix seconds `times` on `canvas`: y from 0 to a round maximum with three
// gridlines, x labelled in seconds before the newest point.
function drawChart(canvas, times, values, colorVar) {
  const style = getComputedStyle(document.documentElement);
  const color = style.getPropertyValue(colorVar).trim();
  const muted = style.getPropertyValue("--muted").trim();
  const grid = style.getPropertyValue("--line").trim();
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (width === 0 || height === 0) return;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";

  const pad = {left: 44, right: 10, top: 8, bottom: 22};
  const plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
  const n = Math.min(times.length, values.length);
  const yMax = niceMax(n > 0 ? Math.max(...values.slice(0, n)) : 0);
  const tEnd = n > 0 ? times[n - 1] : 0;
  const span = n > 1 ? Math.max(1, tEnd - times[0]) : 60;
  const x = (t) => pad.left + plotW * (1 - (tEnd - t) / span);
  const y = (v) => pad.top + plotH * (1 - v / yMax);

  ctx.strokeStyle = grid;
  ctx.fillStyle = muted;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const share of [0, 0.5, 1]) {
    const gy = Math.round(y(yMax * share)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.left, gy); ctx.lineTo(width - pad.right, gy); ctx.stroke();
    ctx.fillText(String(+(yMax * share).toPrecision(3)), pad.left - 6, gy);
  }
  ctx.textBaseline = "top";
  for (const share of [0, 0.5, 1]) {
    ctx.textAlign = share === 0 ? "left" : share === 1 ? "right" : "center";
    const ago = Math.round(span * (1 - share));
    ctx.fillText(ago === 0 ? "now" : `-${ago}s`, pad.left + plotW * share, height - pad.bottom + 6);
  }
  if (n === 0) {
    ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.fillText("no data yet", pad.left + plotW / 2, pad.top + plotH / 2);
    return;
  }
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  for (let i = 0; i < n; i++) {
    if (i === 0) ctx.moveTo(x(times[i]), y(values[i])); else ctx.lineTo(x(times[i]), y(values[i]));
  }
  ctx.stroke();
  ctx.fillStyle = color;
  ctx.beginPath(); ctx.arc(x(times[n - 1]), y(values[n - 1]), 3, 0, 2 * Math.PI); ctx.fill();
}

// The latest cluster tokens/s: the series' newest point, else the pipelines' sum.
function latestTokensPerS(snap) {
  const series = snap.series.tokens_per_s;
  if (series.length > 0) return series[series.length - 1];
  return snap.plan.pipelines.reduce((sum, p) => sum + p.tokens_per_s, 0);
}

function renderCharts(snap) {
  const series = snap.series;
  $("tokens-per-s").textContent = fixed(latestTokensPerS(snap));
  const queue = series.queue_depth;
  $("queue-depth").textContent = queue.length > 0 ? String(queue[queue.length - 1])
    : String(snap.nodes.reduce((sum, n) => sum + n.queue_depth, 0));
  drawChart($("chart-tokens"), series.t, series.tokens_per_s, "--chart-tokens");
  drawChart($("chart-queue"), series.t, series.queue_depth, "--chart-queue");
}

// ---- wiring ----------------------------------------------------------------------------------

let latest = null;

function render(snap) {
  latest = snap;
  renderHeader(snap);
  renderNodes(snap);
  renderCharts(snap);
  renderShares(snap);
  renderLatency(snap);
  renderRejections(snap);
}

function connect() {
  const events = new EventSource("/api/events");
  events.onopen = () => setConnection("live");
  // EventSource reconnects by itself; the indicator says so until it is open again.
  events.onerror = () => setConnection("reconnecting");
  events.addEventListener("snapshot", (event) => {
    setConnection("live");
    render(JSON.parse(event.data));
  });
}

async function start() {
  try {
    const response = await fetch("/api/state", {cache: "no-store"});
    if (response.ok) render(await response.json());
  } catch (error) {
    setConnection("reconnecting");
  }
  connect();
}

window.addEventListener("resize", () => { if (latest) renderCharts(latest); });
start();
