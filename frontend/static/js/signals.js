// Golden-signals panels (apps.signals): two uPlot charts per panel, drawn from the panel's JSON data block
// (data, never executed; CSP allows no inline script). Changes are dashed vertical lines (the list under the
// charts says who did what); a click on a point opens the sampled requests of its seconds.
(function () {
  "use strict";

  const COLORS = { "2xx": "#1a7f37", "3xx": "#0b63ce", "4xx": "#b35900", "backend 5xx": "#c62828",
                   "HAProxy 5xx": "#7b61ff" };

  function markerPlugin(markers) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#555";
          ctx.setLineDash([4, 4]);
          ctx.lineWidth = 1;
          markers.forEach((m) => {
            const x = u.valToPos(m.t, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) { return; }
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
          });
          ctx.restore();
        }],
      },
    };
  }

  function build(kind, data) {
    const s = data.series;
    if (kind === "rate") {
      return {
        cols: [s.rate_2xx, s.rate_3xx, s.rate_4xx, s.rate_backend_5xx, s.rate_proxy_5xx],
        specs: ["2xx", "3xx", "4xx", "backend 5xx", "HAProxy 5xx"].map((label) => ({ label: label, stroke: COLORS[label], width: 2 })),
        unit: "req/s",
      };
    }
    if (kind === "sessions") {
      return {
        cols: [s.sessions || []],
        specs: [{ label: "open sessions", stroke: "#0b63ce", width: 2, points: { show: true, size: 4 } }],
        unit: "sessions",
      };
    }
    return {
      cols: [s.total_p50_ms, s.total_p99_ms, s.upstream_p99_ms, s.connect_p99_ms],
      specs: [
        // Points too: a percentile exists only where requests came, so a quiet chart has isolated values.
        { label: "total p50", stroke: "#0b63ce", width: 2, points: { show: true, size: 4 } },
        { label: "total p99", stroke: "#c62828", width: 2, points: { show: true, size: 4 } },
        { label: "upstream p99", stroke: "#b35900", width: 2, dash: [8, 4], points: { show: true, size: 4 } },
        { label: "connect p99", stroke: "#1a7f37", width: 1, points: { show: true, size: 3 } },
      ],
      unit: "ms",
    };
  }

  function draw(panel) {
    if (typeof uPlot === "undefined") { return; }
    const block = document.getElementById(panel.dataset.signalsFrom);
    if (!block) { return; }
    let data;
    try { data = JSON.parse(block.textContent); } catch (err) { return; }
    panel.querySelectorAll(".signals-chart").forEach((el) => {
      const built = build(el.dataset.chart, data);
      if (el.spwChart) { el.spwChart.destroy(); }  // uPlot keeps every live chart: a redraw must free the last
      el.replaceChildren();
      const width = Math.max(el.clientWidth || (el.parentElement && el.parentElement.clientWidth) || 600, 300);
      const chart = new uPlot({
        width: width, height: 220, series: [{}].concat(built.specs),
        scales: { x: { time: true } }, axes: [{}, { label: built.unit }],
        plugins: [markerPlugin(data.markers || [])],
      }, [data.time].concat(built.cols), el);
      el.spwChart = chart;
      // A click on a point (a spike) opens the sampled requests of that point's seconds.
      const base = panel.dataset.requestsUrl;
      if (base) {
        chart.over.style.cursor = "pointer";
        chart.over.addEventListener("click", () => {
          const idx = chart.cursor.idx;
          if (idx === null || idx === undefined) { return; }
          const since = data.time[idx];
          window.location.href = base + "&since=" + since + "&until=" + (since + data.point_s);
        });
      }
    });
  }

  function drawAll(root) { root.querySelectorAll("[data-signals-from]").forEach(draw); }

  document.addEventListener("DOMContentLoaded", () => drawAll(document));
  document.addEventListener("htmx:afterSwap", (event) => {
    const el = event.detail.elt || event.detail.target;
    // Only what the swap brought: the LB page's other panels poll every few seconds.
    if (el && el.matches && el.matches("[data-signals-from]")) { draw(el); } else if (el && el.querySelectorAll) { drawAll(el); }
  });
  document.addEventListener("htmx:afterSettle", (event) => {
    const el = event.detail.elt;
    if (el && el.matches && el.matches("[data-signals-from]")) { draw(el); }
  });
})();
