// Capacity charts with uPlot: latency (p50, p99) against offered rate with the knee marked, and
// errors per step as bars. Data comes from chart.json endpoints named in data- attributes (CSP
// forbids inline scripts and inline data). Several comma-separated URLs overlay runs (comparison).
(function () {
  "use strict";

  const COLORS = [["#0b63ce", "#7aa7e6"], ["#c62828", "#e89a9a"]];

  function fetchAll(urls) {
    return Promise.all(urls.map((url) => fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => { if (!r.ok) { throw new Error(url + ": " + r.status); } return r.json(); })));
  }

  function width(el) {
    return Math.max(el.clientWidth || el.parentElement.clientWidth || 600, 300);
  }

  function empty(el, text) {
    const p = document.createElement("p");
    p.className = "capacity-chart-empty";
    p.textContent = text;
    el.replaceChildren(p);
  }

  // One x axis for all runs: the union of their offered rates; each series is null where a run has no step.
  function latencyChart(el, runs) {
    const xs = Array.from(new Set(runs.flatMap((r) => r.offered_rate))).sort((a, b) => a - b);
    if (!xs.length) { empty(el, "No steps measured yet."); return; }
    const data = [xs];
    const series = [{ label: "offered (req/s)" }];
    runs.forEach((run, i) => {
      const [strong, light] = COLORS[i % COLORS.length];
      // 0 ms means "no 2xx answer in that step": leave a gap (and keep the log scale valid).
      const at = (values) => xs.map((x) => { const k = run.offered_rate.indexOf(x); return k < 0 || !values[k] ? null : values[k]; });
      const prefix = runs.length > 1 ? run.label + " " : "";
      data.push(at(run.p50_ms));
      series.push({ label: prefix + "p50 ms", stroke: light, width: 2, spanGaps: true });
      data.push(at(run.p99_ms));
      series.push({ label: prefix + "p99 ms", stroke: strong, width: 2, spanGaps: true });
      // The knee: one point on the p99 curve, drawn large, no line.
      const knee = xs.map((x) => (run.knee_index !== null && run.offered_rate[run.knee_index] === x ? run.p99_ms[run.knee_index] : null));
      data.push(knee);
      series.push({ label: prefix + "knee", stroke: "#1a7f37", fill: "#1a7f37", width: 0, paths: () => null,
                    points: { show: true, size: 14, fill: "#1a7f37", stroke: "#1a7f37" } });
    });
    if (runs.length === 1 && runs[0].slo_p99_ms) {
      data.push(xs.map(() => runs[0].slo_p99_ms));
      series.push({ label: "SLO p99", stroke: "#b35900", width: 1, dash: [6, 4] });
    }
    const opts = {
      width: width(el), height: 320, series: series,
      scales: { x: { time: false }, y: { distr: 3 } },  // log latency: a knee makes p99 jump by orders
      axes: [{ label: "offered rate (req/s)" }, { label: "latency (ms)" }],
    };
    el.replaceChildren();
    return new uPlot(opts, data, el);
  }

  function errorChart(el, run) {
    if (!run.offered_rate.length) { empty(el, "No steps measured yet."); return; }
    const xs = run.offered_rate.map((_, i) => i + 1);
    const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.6, 60] }) : undefined;
    const opts = {
      width: width(el), height: 180,
      series: [{ label: "step" }, { label: "errors", stroke: "#c62828", fill: "rgba(198,40,40,.45)", paths: bars, points: { show: false } }],
      // Half a step of padding each side so the first and last bars are drawn whole.
      scales: { x: { time: false, range: [0.5, xs.length + 0.5] }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
      axes: [{ label: "step (offered req/s)", splits: () => xs, values: (u, ticks) => ticks.map((t) => t + " (" + run.offered_rate[t - 1] + ")") },
             { label: "errors" }],
    };
    el.replaceChildren();
    return new uPlot(opts, [xs, run.errors], el);
  }

  const REGION_COLORS = ["#0b63ce", "#1a7f37", "#b35900", "#6f42c1", "#c62828", "#00838f"];

  // Shade the drained span [from, to] (seconds) behind the series.
  function drainedBand(span) {
    return (u) => {
      if (!span) { return; }
      const x0 = u.valToPos(span[0], "x", true), x1 = u.valToPos(span[1], "x", true);
      const ctx = u.ctx;
      ctx.save();
      ctx.fillStyle = "rgba(198,40,40,.10)";
      ctx.fillRect(x0, u.bbox.top, x1 - x0, u.bbox.height);
      ctx.restore();
    };
  }

  function drillChart(el, d) {
    if (!d.t.length) { empty(el, "No second sampled yet."); return; }
    const data = [d.t];
    const series = [{ label: "s" }];
    d.regions.forEach((r, i) => {
      const color = REGION_COLORS[i % REGION_COLORS.length];
      data.push(d.served[r]);
      series.push({ label: r + (r === d.region ? " (drained)" : "") + " req/s", stroke: color, width: 2 });
      data.push(d.capacity[r]);
      series.push({ label: r + " capacity", stroke: color, width: 1, dash: [6, 4] });
    });
    const opts = {
      width: width(el), height: 320, series: series,
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
      axes: [{ label: "seconds since the drill started" }, { label: "req/s served" }],
      hooks: { drawClear: [drainedBand(d.drained)] },
    };
    el.replaceChildren();
    return new uPlot(opts, data, el);
  }

  function drillErrorChart(el, d) {
    if (!d.t.length) { empty(el, "No second sampled yet."); return; }
    const series = [{ label: "s" }, { label: "error rate %", stroke: "#c62828", width: 2 },
                    { label: "SLO %", stroke: "#b35900", width: 1, dash: [6, 4] }];
    const data = [d.t, d.error_rate, d.t.map(() => d.slo_error_rate_pct)];
    if (d.p99_ms.some((v) => v !== null)) {
      data.push(d.p99_ms);
      series.push({ label: "p99 ms", stroke: "#6f42c1", width: 1, scale: "ms" });
    }
    const opts = {
      width: width(el), height: 180, series: series,
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
      axes: [{ label: "seconds" }, { label: "% failed" }, { side: 1, scale: "ms", label: "ms", grid: { show: false } }],
      hooks: { drawClear: [drainedBand(d.drained)] },
    };
    el.replaceChildren();
    return new uPlot(opts, data, el);
  }

  function init() {
    if (typeof uPlot === "undefined") { return; }
    document.querySelectorAll("[data-drill-chart]").forEach((el) => {
      fetchAll([el.dataset.drillChart]).then((d) => { el.dataset.rendered = "1"; drillChart(el, d[0]); })
        .catch((err) => empty(el, "Chart unavailable: " + err.message));
    });
    document.querySelectorAll("[data-drill-errors]").forEach((el) => {
      fetchAll([el.dataset.drillErrors]).then((d) => { el.dataset.rendered = "1"; drillErrorChart(el, d[0]); })
        .catch((err) => empty(el, "Chart unavailable: " + err.message));
    });
    document.querySelectorAll("[data-capacity-chart]").forEach((el) => {
      const urls = el.dataset.capacityChart.split(",").filter(Boolean);
      fetchAll(urls).then((runs) => { el.dataset.rendered = "1"; latencyChart(el, runs); })
        .catch((err) => empty(el, "Chart unavailable: " + err.message));
    });
    document.querySelectorAll("[data-capacity-errors]").forEach((el) => {
      fetchAll([el.dataset.capacityErrors]).then((runs) => { el.dataset.rendered = "1"; errorChart(el, runs[0]); })
        .catch((err) => empty(el, "Chart unavailable: " + err.message));
    });
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
})();
