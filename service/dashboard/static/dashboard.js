// Draws the dashboard's charts from the JSON blocks the server rendered (<script type="application/json">).
// Text from the database only ever reaches the page through textContent or the canvas: never as markup.
"use strict";

(function () {
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac"];

  function payload(canvas) {
    return JSON.parse(document.getElementById(canvas.dataset.source).textContent);
  }

  function seconds(value) {
    if (value === null || value === undefined) return "—";
    for (const [unit, scale] of [["s", 1], ["ms", 1e-3], ["µs", 1e-6]]) {
      if (value >= scale) return (value / scale).toPrecision(3) + " " + unit;
    }
    return (value / 1e-9).toPrecision(3) + " ns";
  }

  function clip(text, n) {
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  function bars(canvas) {
    const data = payload(canvas);
    const micros = (xs) => xs.map((v) => (v === null ? null : v * 1e6));
    return new Chart(canvas, {
      type: "bar",
      data: {
        labels: data.labels.map((label) => clip(label, 40)),
        datasets: [
          {label: "eager", data: micros(data.eager), backgroundColor: "#bab0ac"},
          {label: "tuned kernel", data: micros(data.tuned), backgroundColor: "#4e79a7"},
        ],
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {y: {beginAtZero: true, title: {display: true, text: "time per call (µs)"}}},
        plugins: {tooltip: {callbacks: {label: (item) => item.dataset.label + ": " + seconds(item.raw / 1e6)}}},
      },
    });
  }

  function describe(point) {
    return [
      point.kind + " · subgraph " + point.subgraph_id + " · " + point.structural_hash.slice(0, 12),
      point.recipe === null
        ? "no ok measurement on " + point.device
        : "best on " + point.device + ": " + seconds(point.median_s),
      point.recipe === null ? "" : point.recipe,
    ].filter((line) => line !== "");
  }

  function map(canvas) {
    const points = payload(canvas);
    const kinds = Array.from(new Set(points.map((p) => p.kind))).sort();
    const color = (kind) => PALETTE[kinds.indexOf(kind) % PALETTE.length];
    for (const item of document.querySelectorAll("#map-legend [data-kind]")) {
      item.querySelector(".swatch").style.backgroundColor = color(item.dataset.kind);
    }
    const detail = document.getElementById("map-detail");
    const show = (point) => {
      detail.replaceChildren(...describe(point).map((line, i) => {
        const element = document.createElement(i === 0 ? "strong" : i === 2 ? "code" : "div");
        element.textContent = line;
        return element;
      }));
      detail.dataset.kind = point.kind;
    };
    return new Chart(canvas, {
      type: "scatter",
      data: {
        datasets: kinds.map((kind) => ({
          label: kind,
          data: points.filter((p) => p.kind === kind),
          backgroundColor: color(kind),
          pointRadius: 5,
          pointHoverRadius: 8,
        })),
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {x: {title: {display: true, text: "PC 1"}}, y: {title: {display: true, text: "PC 2"}}},
        plugins: {
          legend: {display: false},
          tooltip: {callbacks: {title: (items) => items[0].raw.kind, label: (item) => describe(item.raw).map((l) => clip(l, 90))}},
        },
        onHover: (_event, elements, chart) => {
          if (elements.length === 0) return;
          const hit = elements[0];
          show(chart.data.datasets[hit.datasetIndex].data[hit.index]);
        },
      },
    });
  }

  const DRAW = {bars, map};
  document.addEventListener("DOMContentLoaded", () => {
    for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
      DRAW[canvas.dataset.chart](canvas);
    }
  });
})();
