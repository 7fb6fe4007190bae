// The rowsync monitor page: polls the admin endpoint's JSON API once a second and
// draws what it gets. Every value from the server is put in the page as text, never as
// HTML (user names and errors come from the network).
"use strict";

const POLL_MS = 1000;
const PROFILE_POLL_MS = 10000;
const PHASES = ["connect", "authenticate", "upload_received", "worker_wait",
  "upload_applied", "download_fetched", "download_sent"];
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"];

function el(id) { return document.getElementById(id); }

function cell(row, value, className) {
  const td = row.insertCell();
  td.textContent = value === null || value === undefined ? "" : String(value);
  if (className) td.className = className;
  return td;
}

function ms(value) { return value === null || value === undefined ? "" : value.toFixed(1); }

function makeChart(target, names, colors) {
  const series = [{}].concat(names.map((name, i) => ({
    label: name, stroke: colors[i % colors.length], width: 1.5, spanGaps: false, value: legendValue,
  })));
  const width = Math.max(380, el(target).parentElement.clientWidth - 12);
  const data = [[]].concat(names.map(() => []));
  // The legend shows the newest values unless the pointer picks a moment.
  const hooks = { setCursor: [(u) => { if (u.cursor.idx == null) showNewest(u); }] };
  const options = { width, height: 170, series, axes: [{}, { size: 56 }], hooks };
  return { plot: new uPlot(options, data, el(target)), names };
}

// A legend value; with no point picked, a series with no value at the newest sample (a
// phase no sync ended in) shows its last value instead of "--".
function legendValue(u, value, seriesIdx, idx) {
  if ((value === null || value === undefined) && u.cursor.idx == null && idx != null) {
    const values = u.data[seriesIdx];
    for (let i = Math.min(idx, values.length - 1); i >= 0 && value == null; i--) value = values[i];
  }
  if (value === null || value === undefined) return "--";
  return Number.isInteger(value) ? String(value) : value.toFixed(value < 10 ? 2 : 1);
}

// The legend's values at the newest sample (uPlot shows "--" while no point is picked).
function showNewest(plot) {
  const newest = plot.data[0].length - 1;
  if (newest >= 0) plot.setLegend({ idx: newest }, false);
}

function setData(chart, data) {
  chart.plot.setData(data);
  if (chart.plot.cursor.idx == null) showNewest(chart.plot);
}

const charts = {
  rate: makeChart("chart-rate", ["ok", "refused", "failed", "busy answers"],
    ["#2ca02c", "#ff7f0e", "#d62728", "#9467bd"]),
  phases: makeChart("chart-phases", PHASES, COLORS),
  workers: makeChart("chart-workers", ["workers", "busy", "waiting for a worker", "connections"], COLORS),
  cache: makeChart("chart-cache", ["in memory"], ["#1f77b4"]),
};

// The cache limit is in the chart's title, not a line: a quarter of memory beside a few
// MiB in use would flatten the use to 0.
function drawSeries(samples) {
  const t = samples.map((s) => s.unix_ms / 1000);
  const mib = (b) => b / 1048576;
  setData(charts.rate, [t, samples.map((s) => s.syncs_per_second),
    samples.map((s) => s.refused_per_second), samples.map((s) => s.failed_per_second),
    samples.map((s) => s.busy_answers_per_second)]);
  setData(charts.phases, [t].concat(PHASES.map((_, i) => samples.map((s) => s.phase_ms[i]))));
  setData(charts.workers, [t, samples.map((s) => s.workers), samples.map((s) => s.workers_busy),
    samples.map((s) => s.syncs_waiting_for_worker), samples.map((s) => s.connections)]);
  setData(charts.cache, [t, samples.map((s) => mib(s.cache_bytes))]);
  const newest = samples[samples.length - 1];
  if (newest) el("cache-limit").textContent = mib(newest.cache_bytes_max).toFixed(0);
}

function drawActive(active) {
  el("active-count").textContent = String(active.length);
  const body = el("active").tBodies[0];
  body.replaceChildren();
  for (const sync of active) {
    const row = body.insertRow();
    row.dataset.id = String(sync.id);
    cell(row, sync.id);
    cell(row, sync.user, "text");
    cell(row, sync.client_id, "text");
    cell(row, sync.script_version, "text");
    const phase = cell(row, "", "text");
    const badge = document.createElement("span");
    badge.className = "phase";
    badge.textContent = sync.phase;
    phase.appendChild(badge);
    cell(row, ms(sync.elapsed_ms));
  }
  if (active.length === 0) cell(body.insertRow(), "none", "empty").colSpan = 6;
}

// One row per sync; a refused or failed sync's error in a row of its own beneath it, so
// that it shows in full without widening the table or scrolling.
function drawRecent(syncs) {
  const body = el("recent").tBodies[0];
  body.replaceChildren();
  const columns = el("recent").tHead.rows[0].cells.length;
  for (const sync of syncs) {
    const row = body.insertRow();
    row.className = sync.outcome;
    row.dataset.id = String(sync.id);
    row.dataset.user = sync.user || "";
    cell(row, sync.id);
    cell(row, new Date(sync.started_unix_ms).toLocaleTimeString(), "text");
    cell(row, sync.user, "text");
    cell(row, sync.client_id, "text client").title = sync.client_id || "";
    cell(row, sync.script_version, "text");
    cell(row, sync.outcome, "text");
    cell(row, ms(sync.duration_ms));
    const byPhase = new Map(sync.phases.map((p) => [p.phase, p.ms]));
    for (const phase of PHASES) cell(row, ms(byPhase.get(phase)));
    cell(row, sync.rows_uploaded);
    cell(row, sync.rows_downloaded);
    cell(row, sync.bytes_received);
    cell(row, sync.bytes_sent);
    cell(row, sync.conflicts);
    if (sync.error) {
      const errorRow = body.insertRow();
      errorRow.className = "error-row " + sync.outcome;
      errorRow.dataset.id = String(sync.id);
      const td = errorRow.insertCell();
      td.colSpan = columns;
      td.className = "error";
      const text = document.createElement("div");
      text.textContent = sync.error;
      td.appendChild(text);
    }
  }
  if (syncs.length === 0) cell(body.insertRow(), "no syncs yet", "empty").colSpan = columns;
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

// The contention profile (`rowsync profile --out FILE`, served with `serve
// --profile-report FILE`): one row per script or sync type at its largest copy count.
function drawProfile(report) {
  const body = el("profile").tBodies[0];
  const plans = el("plans").tBodies[0];
  body.replaceChildren();
  plans.replaceChildren();
  el("profile-status").textContent = "script version " + report.script_version + " on " + report.database +
    ", " + new Date(report.created_unix_ms).toLocaleString() + ", " + report.cores + " cores";
  for (const target of report.targets) {
    const largest = Math.max(0, ...target.runs.map((run) => run.copies));
    const run = (parameters) => target.runs.find((r) => r.copies === largest && r.parameters === parameters);
    const row = body.insertRow();
    row.className = target.verdict.kind === "clean" ? "" : "failed";
    cell(row, target.name, "text");
    cell(row, ms(target.alone_ms));
    cell(row, largest);
    for (const parameters of ["identical", "distinct"]) {
      const r = run(parameters);
      cell(row, r ? ms(r.wall_ms) : "");
      cell(row, r && r.ratio !== null ? r.ratio.toFixed(2) : "");
    }
    cell(row, target.waits.map((w) => w.wait + " " + w.samples).join(", "), "text");
    cell(row, target.hot_rows.map((h) => h.relation + " (" + h.key + ")").join(", "), "text");
    cell(row, target.verdict.finding + (target.verdict.remedy ? "; " + target.verdict.remedy : ""), "error");
  }
  for (const plan of report.plans || []) {
    for (const finding of plan.findings) {
      const row = plans.insertRow();
      cell(row, plan.table, "text");
      cell(row, plan.event, "text");
      cell(row, finding.detail, "error");
      cell(row, finding.proposal || "", "text");
    }
  }
}

async function pollProfile() {
  try {
    const response = await fetch("/api/monitor/profile", { cache: "no-store" });
    if (response.ok) drawProfile(await response.json());
    else el("profile-status").textContent = await response.text();
  } catch (error) {
    el("profile-status").textContent = "no profile report: " + error.message;
  }
  setTimeout(pollProfile, PROFILE_POLL_MS);
}

let polls = 0;
async function poll() {
  const query = new URLSearchParams({
    user: el("filter-user").value.trim(),
    outcome: el("filter-outcome").value,
    limit: el("filter-limit").value,
  });
  try {
    const [active, syncs, series] = await Promise.all([
      getJson("/api/monitor/active"),
      getJson("/api/monitor/syncs?" + query),
      getJson("/api/monitor/series"),
    ]);
    drawActive(active);
    drawRecent(syncs);
    drawSeries(series);
    polls += 1;
    const status = el("status");
    status.dataset.polls = String(polls);
    status.textContent = "updated " + new Date().toLocaleTimeString() + " · " + syncs.length +
      " recent syncs shown · " + series.length + " samples";
  } catch (error) {
    el("status").textContent = "cannot reach the server: " + error.message;
  }
  setTimeout(poll, POLL_MS);
}

poll();
pollProfile();
