// The spend page's charts (console2): each canvas[data-chart] names the json_script element
// holding its Chart.js data ({labels, datasets}), rendered as stacked bars. No build step.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
    const data = JSON.parse(document.getElementById(canvas.dataset.chart).textContent);
    new Chart(canvas, {
      type: "bar",
      data,
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        scales: {
          x: { stacked: true },
          y: { stacked: true, beginAtZero: true, title: { display: true, text: canvas.dataset.unit } },
        },
      },
    });
  }
});
