// Overflow page: bar widths (CSP forbids style= attributes, so widths are set here) and the uPlot
// timeline. The panel is re-fetched by htmx every few seconds; it carries the series as a JSON
// <script type="application/json"> block (data, never executed), which this file reads after each swap.
(function () {
  "use strict";

  // One hue per region; within a region: local solid, out dashed, in dotted, capacity thin.
  const HUES = ["#0b63ce", "#c62828", "#1a7f37", "#7b61ff", "#b35900", "#00838f"];

  function sizeBars(root) {
    root.querySelectorAll("[data-bar]").forEach((el) => {
      const value = parseFloat(el.dataset.bar) || 0;
      const scale = parseFloat(el.dataset.scale) || 1;
      el.style.width = Math.max(0, Math.min(100, (value / scale) * 100)).toFixed(2) + "%";
    });
  }

  function readSeries(id) {
    const node = document.getElementById(id);
    if (!node) { return null; }
    try { return JSON.parse(node.textContent); } catch (err) { return null; }
  }

  function build(series) {
    const regions = Object.keys(series.regions).sort();
    const data = [series.time];
    const specs = [{}];
    regions.forEach((region, i) => {
      const hue = HUES[i % HUES.length];
      const cols = series.regions[region];
      data.push(cols.local, cols.out, cols.in, cols.capacity);
      specs.push(
        { label: region + " local", stroke: hue, width: 2 },
        { label: region + " out", stroke: hue, width: 2, dash: [8, 4] },
        { label: region + " in", stroke: hue, width: 2, dash: [2, 3] },
        { label: region + " capacity", stroke: hue, width: 1, alpha: 0.5, spanGaps: true },
      );
    });
    return { data: data, specs: specs, key: regions.join(",") };
  }

  function span(times) {
    const lo = Math.min.apply(null, times);
    const hi = Math.max.apply(null, times);
    return lo === hi ? [lo - 60, hi + 60] : [lo, hi];
  }

  let chart = null;
  let chartKey = "";

  function width(el) {
    return Math.max(el.clientWidth || (el.parentElement && el.parentElement.clientWidth) || 600, 300);
  }

  function drawChart() {
    const el = document.getElementById("overflow-chart");
    if (!el || typeof uPlot === "undefined") { return; }
    const series = readSeries(el.dataset.seriesFrom);
    if (!series || !series.time.length) {
      if (chart) { chart.destroy(); chart = null; chartKey = ""; }
      const p = document.createElement("p");
      p.className = "traffic-chart-empty";
      p.textContent = "No traffic recorded in this window yet.";
      el.replaceChildren(p);
      return;
    }
    const built = build(series);
    if (chart && built.key === chartKey) {
      chart.setData(built.data);  // same regions: update in place, keep the user's legend toggles
      const [lo, hi] = span(series.time);
      chart.setScale("x", { min: lo, max: hi });
      return;
    }
    if (chart) { chart.destroy(); }
    el.replaceChildren();
    chart = new uPlot({
      width: width(el), height: 300, series: built.specs,
      // The span of the data, a minute each side when it is one point (a window's first bucket): left to itself,
      // uPlot spread a single point's axis over years.
      scales: { x: { time: true, auto: false, range: span(series.time) } },
      axes: [{}, { label: "req/s" }],
    }, built.data, el);
    chartKey = built.key;
  }

  document.addEventListener("DOMContentLoaded", () => { sizeBars(document); drawChart(); });
  document.addEventListener("htmx:afterSwap", (event) => {
    sizeBars(event.detail.target);
    if (event.detail.target.id === "overflow-panel") { drawChart(); }
  });
  window.addEventListener("resize", () => {
    const el = document.getElementById("overflow-chart");
    if (chart && el) { chart.setSize({ width: width(el), height: 300 }); }
  });
})();
