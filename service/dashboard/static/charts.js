/* Small inline-SVG charts: a time-series line chart and a bar chart. No dependencies. */
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg";

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceTicks(max, count) {
    if (!(max > 0)) return [0, 1];
    const raw = max / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let v = 0; v <= max + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
    if (ticks[ticks.length - 1] < max) ticks.push(+(ticks[ticks.length - 1] + step).toPrecision(12));
    return ticks;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1000) return v.toLocaleString("en-US", { maximumFractionDigits: 0 });
    if (a >= 10) return v.toFixed(1).replace(/\.0$/, "");
    if (a >= 0.01) return (+v.toPrecision(3)).toString();
    return v.toExponential(1);
  }

  function timeLabel(ms, spanMs) {
    const d = new Date(ms);
    const iso = d.toISOString();
    if (spanMs <= 600e3) return iso.slice(11, 19);
    if (spanMs <= 2 * 86400e3) return iso.slice(11, 16);
    return iso.slice(5, 10) + " " + iso.slice(11, 16);
  }

  /* Line chart. opts: {series: [{name, cls, points: [{x: ms, y}], step}], lines: [{y, label, cls}],
     yLabel, height, title} */
  function lineChart(container, opts) {
    const width = Math.max(container.clientWidth || 640, 320);
    const height = opts.height || 260;
    const m = { top: 16, right: 20, bottom: 30, left: 56 };
    const w = width - m.left - m.right, h = height - m.top - m.bottom;
    const all = opts.series.flatMap((s) => s.points);
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", height, role: "img",
      "aria-label": opts.title || "chart", class: "chart" });
    if (all.length === 0) {
      svg.appendChild(el("text", { x: width / 2, y: height / 2, "text-anchor": "middle",
        class: "chart-empty" }, "No data yet"));
      container.replaceChildren(svg);
      return svg;
    }
    let x0 = Math.min(...all.map((p) => p.x)), x1 = Math.max(...all.map((p) => p.x));
    if (x1 === x0) { x0 -= 1800e3; x1 += 1800e3; }
    const yMaxData = Math.max(...all.map((p) => p.y), ...(opts.lines || []).map((l) => l.y));
    const ticks = niceTicks(yMaxData * 1.05, 5);
    const yMax = ticks[ticks.length - 1];
    const X = (x) => m.left + ((x - x0) / (x1 - x0)) * w;
    const Y = (y) => m.top + h - (y / yMax) * h;
    const g = el("g");
    for (const t of ticks) {
      g.appendChild(el("line", { x1: m.left, x2: m.left + w, y1: Y(t), y2: Y(t), class: "grid" }));
      g.appendChild(el("text", { x: m.left - 8, y: Y(t) + 4, "text-anchor": "end", class: "tick" }, fmt(t)));
    }
    const nx = Math.min(6, Math.max(2, Math.floor(w / 110)));
    for (let i = 0; i <= nx; i++) {
      const x = x0 + ((x1 - x0) * i) / nx;
      g.appendChild(el("text", { x: X(x), y: m.top + h + 20, "text-anchor": "middle", class: "tick" },
        timeLabel(x, x1 - x0)));
    }
    g.appendChild(el("line", { x1: m.left, x2: m.left + w, y1: m.top + h, y2: m.top + h, class: "axis" }));
    if (opts.yLabel) {
      g.appendChild(el("text", { x: 12, y: m.top + h / 2, transform: `rotate(-90 12 ${m.top + h / 2})`,
        "text-anchor": "middle", class: "axis-label" }, opts.yLabel));
    }
    for (const line of opts.lines || []) {
      g.appendChild(el("line", { x1: m.left, x2: m.left + w, y1: Y(line.y), y2: Y(line.y),
        class: "ref " + (line.cls || "") }));
      g.appendChild(el("text", { x: m.left + w - 4, y: Y(line.y) - 6, "text-anchor": "end",
        class: "ref-label " + (line.cls || "") }, line.label));
    }
    for (const s of opts.series) {
      if (s.points.length === 0) continue;
      let d = "";
      s.points.forEach((p, i) => {
        if (i === 0) d += `M${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`;
        else if (s.step) d += `H${X(p.x).toFixed(1)}V${Y(p.y).toFixed(1)}`;
        else d += `L${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`;
      });
      const path = el("path", { d, class: "series " + (s.cls || ""), "data-series": s.name });
      g.appendChild(path);
      if (s.points.length <= 60) {
        for (const p of s.points) {
          const dot = el("circle", { cx: X(p.x), cy: Y(p.y), r: 2.5, class: "dot " + (s.cls || "") });
          dot.appendChild(el("title", {}, `${s.name}: ${fmt(p.y)} at ${new Date(p.x).toISOString().slice(0, 16)}Z`));
          g.appendChild(dot);
        }
      }
    }
    svg.appendChild(g);
    container.replaceChildren(svg);
    if (opts.series.length > 1 || (opts.lines || []).length) {
      const legend = document.createElement("div");
      legend.className = "legend";
      for (const s of opts.series) {
        const item = document.createElement("span");
        item.className = "legend-item " + (s.cls || "");
        item.textContent = s.name;
        legend.appendChild(item);
      }
      container.appendChild(legend);
    }
    return svg;
  }

  /* Bar chart. opts: {bars: [{label, value, title}], yLabel, height, cls, labelEvery} */
  function barChart(container, opts) {
    const width = Math.max(container.clientWidth || 640, 320);
    const height = opts.height || 220;
    const m = { top: 14, right: 12, bottom: 34, left: 56 };
    const w = width - m.left - m.right, h = height - m.top - m.bottom;
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", height, role: "img",
      "aria-label": opts.title || "chart", class: "chart" });
    const bars = opts.bars;
    const ticks = niceTicks(Math.max(0, ...bars.map((b) => b.value)) * 1.05 || 1, 4);
    const yMax = ticks[ticks.length - 1] || 1;
    const Y = (y) => m.top + h - (y / yMax) * h;
    for (const t of ticks) {
      svg.appendChild(el("line", { x1: m.left, x2: m.left + w, y1: Y(t), y2: Y(t), class: "grid" }));
      svg.appendChild(el("text", { x: m.left - 8, y: Y(t) + 4, "text-anchor": "end", class: "tick" }, fmt(t)));
    }
    const slot = w / Math.max(1, bars.length);
    const every = opts.labelEvery || Math.max(1, Math.ceil(bars.length / Math.floor(w / 56)));
    bars.forEach((b, i) => {
      const x = m.left + i * slot + slot * 0.12;
      const bw = Math.max(1, slot * 0.76);
      const rect = el("rect", { x, y: Y(b.value), width: bw, height: Math.max(0, m.top + h - Y(b.value)),
        class: "bar " + (opts.cls || ""), rx: 2 });
      rect.appendChild(el("title", {}, b.title || `${b.label}: ${fmt(b.value)}`));
      svg.appendChild(rect);
      if (i % every === 0) {
        svg.appendChild(el("text", { x: x + bw / 2, y: m.top + h + 16, "text-anchor": "middle", class: "tick" }, b.label));
      }
    });
    svg.appendChild(el("line", { x1: m.left, x2: m.left + w, y1: m.top + h, y2: m.top + h, class: "axis" }));
    if (opts.yLabel) {
      svg.appendChild(el("text", { x: 12, y: m.top + h / 2, transform: `rotate(-90 12 ${m.top + h / 2})`,
        "text-anchor": "middle", class: "axis-label" }, opts.yLabel));
    }
    container.replaceChildren(svg);
    return svg;
  }

  window.Charts = { lineChart, barChart, fmt };
})();
