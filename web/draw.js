// Drawing on canvases: the attention heatmap (words on both axes) and the GFLOP/s chart.

// White → deep blue, for weights in [0, 1].
function shade(v) {
  const t = Math.max(0, Math.min(1, v));
  const r = Math.round(255 - t * (255 - 8));
  const g = Math.round(255 - t * (255 - 48));
  const b = Math.round(255 - t * (255 - 107));
  return `rgb(${r},${g},${b})`;
}

/** Draws the n×n row-major `weights` as a heatmap labelled by `words`. */
export function heatmap(canvas, words, weights) {
  const n = words.length;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "13px system-ui, sans-serif";
  const label = Math.min(140, 12 + Math.max(...words.map((w) => ctx.measureText(w).width)));
  const size = Math.max(8, Math.floor(Math.min(canvas.width - label - 10, canvas.height - label - 10) / n));
  const x0 = label, y0 = 10;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const v = weights[i * n + j];
      ctx.fillStyle = shade(v);
      ctx.fillRect(x0 + j * size, y0 + i * size, size, size);
      if (size >= 34) {
        ctx.fillStyle = v > 0.55 ? "#fff" : "#222";
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.font = "11px ui-monospace, monospace";
        ctx.fillText(v.toFixed(2), x0 + (j + 0.5) * size, y0 + (i + 0.5) * size);
      }
    }
  }
  ctx.strokeStyle = "#999";
  ctx.strokeRect(x0, y0, n * size, n * size);
  ctx.fillStyle = "#222";
  ctx.font = "13px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  words.forEach((w, i) => ctx.fillText(w, x0 - 6, y0 + (i + 0.5) * size));
  ctx.save();
  ctx.textAlign = "right";
  words.forEach((w, j) => {
    ctx.save();
    ctx.translate(x0 + (j + 0.5) * size, y0 + n * size + 6);
    ctx.rotate(-Math.PI / 4);
    ctx.fillText(w, 0, 0);
    ctx.restore();
  });
  ctx.restore();
}

const COLORS = { "attention GPU": "#1f5fbf", "attention CPU": "#8fb3e8", "layer GPU": "#c0392b", "layer CPU": "#eda59c" };

/** Draws GFLOP/s against n (log2 axis) for each series of `points` ({kind, n, gpu_gflops, cpu_gflops}). */
export function chart(canvas, points) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  ctx.clearRect(0, 0, W, H);
  const series = {};
  for (const p of points) {
    (series[`${p.kind} GPU`] ??= []).push([p.n, p.gpu_gflops]);
    (series[`${p.kind} CPU`] ??= []).push([p.n, p.cpu_gflops]);
  }
  const all = Object.values(series).flat();
  if (all.length === 0) return;
  const L = 60, R = 150, T = 20, B = 40;
  const xs = all.map((p) => Math.log2(p[0]));
  let xmin = Math.min(...xs), xmax = Math.max(...xs);
  if (xmax === xmin) { xmin -= 1; xmax += 1; }
  const ymax = Math.max(...all.map((p) => p[1])) * 1.1 || 1;
  const X = (n) => L + ((Math.log2(n) - xmin) / (xmax - xmin)) * (W - L - R);
  const Y = (v) => H - B - (v / ymax) * (H - T - B);
  ctx.strokeStyle = "#444";
  ctx.beginPath(); ctx.moveTo(L, T); ctx.lineTo(L, H - B); ctx.lineTo(W - R, H - B); ctx.stroke();
  ctx.fillStyle = "#222"; ctx.font = "12px system-ui, sans-serif";
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (let k = 0; k <= 4; k++) {
    const v = (ymax * k) / 4;
    ctx.fillText(v.toPrecision(2), L - 6, Y(v));
    ctx.strokeStyle = "#eee"; ctx.beginPath(); ctx.moveTo(L + 1, Y(v)); ctx.lineTo(W - R, Y(v)); ctx.stroke();
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (const n of [...new Set(all.map((p) => p[0]))]) ctx.fillText(String(n), X(n), H - B + 6);
  ctx.fillText("n (sequence length)", (L + W - R) / 2, H - 18);
  ctx.save(); ctx.translate(14, (T + H - B) / 2); ctx.rotate(-Math.PI / 2); ctx.fillText("GFLOP/s", 0, 0); ctx.restore();
  let ly = T;
  for (const [name, pts] of Object.entries(series)) {
    pts.sort((a, b) => a[0] - b[0]);
    ctx.strokeStyle = ctx.fillStyle = COLORS[name] ?? "#333";
    ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach(([n, v], i) => (i ? ctx.lineTo(X(n), Y(v)) : ctx.moveTo(X(n), Y(v))));
    ctx.stroke();
    for (const [n, v] of pts) { ctx.beginPath(); ctx.arc(X(n), Y(v), 3, 0, 2 * Math.PI); ctx.fill(); }
    ctx.fillRect(W - R + 12, ly + 4, 14, 4);
    ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
    ctx.fillText(name, W - R + 32, ly + 6);
    ly += 20;
  }
  ctx.lineWidth = 1;
}
