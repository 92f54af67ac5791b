// The page: opens WebGPU through the wasm module, runs the demo and the modifiers example at
// once, and the verify sweep and the benchmark on request (or by themselves with ?verify and
// ?bench). Results are also left on `window.wgpuAttention` for scripts (web/test/run.mjs),
// with `wgpuAttention.sdpa(request)`: one attention call (the crate's `Session::sdpa`, its
// request and result as objects; it rejects with the library's message).

import init, { open, has_webgpu } from "./pkg/wgpu_attention_web.js";
import { heatmap, chart } from "./draw.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = (window.wgpuAttention = {
  info: null, f16: null, demo: null, mods: null, verify: null, bench: [], error: null, sdpa: null,
});
const fmt = (v) => (v === null || v === undefined ? "-" : Number(v).toExponential(2));

function noWebGpu(reason) {
  $("no-webgpu").hidden = false;
  $("no-webgpu-reason").textContent = reason;
  $("adapter-summary").textContent = "no adapter";
  state.error = reason;
  document.title = `no WebGPU: ${reason}`;
}

// wgpu leaves the adapter's name empty in the browser; WebGPU's own `adapter.info` says more.
async function browserAdapterName() {
  try {
    const i = (await navigator.gpu.requestAdapter())?.info;
    return i ? [i.vendor, i.architecture, i.description].filter(Boolean).join(" ") : "";
  } catch {
    return "";
  }
}

function showAdapter(info) {
  const name = info.name || "(unnamed adapter)";
  const limits = params.get("limits") === "default" ? " (WebGPU's default limits requested)" : "";
  $("adapter-summary").textContent =
    `${name}${limits} — backend ${info.backend}, ${info.device_type}; kernel families: ${info.families.join(", ")}` +
    (info.subgroup_size ? `; subgroup size ${info.subgroup_size}` : "");
  $("adapter-features").textContent = `features: ${info.features.join(", ") || "none"}`;
  $("adapter-limits").innerHTML = info.limits.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("");
}

async function runDemo(session) {
  $("demo-run").disabled = true;
  try {
    const r = JSON.parse(await session.demo($("sentence").value, 42));
    state.demo = r;
    $("demo-vocab").textContent =
      `vocabulary: ${JSON.stringify(r.vocab)} · indices: [${r.indices.join(", ")}] · context ${r.context_shape.join("×")}`;
    heatmap($("heatmap"), r.words, r.weights);
    $("demo-diff").textContent =
      `vs the f64 CPU reference (wasm): weights max abs ${fmt(r.weights_max)} (rel ${fmt(r.weights_rel)}), ` +
      `context max abs ${fmt(r.context_max)} (rel ${fmt(r.context_rel)}); GPU call ${r.ms.toFixed(1)} ms`;
  } catch (e) {
    $("demo-diff").textContent = `error: ${e.message ?? e}`;
    state.demo = { error: String(e.message ?? e) };
  }
  $("demo-run").disabled = false;
}

// The modifiers example: fixed Q, K, V (1 batch, 2 heads, 16 positions, width 8) and four
// documents; the page's WGSL against the documents preset.
const MOD_SHAPE = [1, 2, 16, 8];
const MOD_DOCS = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3];
function modTensor(seed) {
  const n = MOD_SHAPE.reduce((a, b) => a * b);
  return { shape: MOD_SHAPE, data: Array.from({ length: n }, (_, i) => Math.sin(0.37 * ((i * 7 + seed * 13) % 23))) };
}

async function runModifiers() {
  $("mod-run").disabled = true;
  const wgsl = $("mod-wgsl").value;
  const role = /\bfn\s+score_mod\b/.test(wgsl) ? "score_mod" : "mask_mod";
  const base = { q: modTensor(1), k: modTensor(2), v: modTensor(3), causal: true };
  try {
    const own = await state.sdpa({
      ...base, weights: true, [role]: { origin: "page.wgsl", wgsl }, buffers: [{ name: "doc", i32: MOD_DOCS }],
    });
    const preset = await state.sdpa({ ...base, presets: [{ documents: [MOD_DOCS] }], reference: true });
    let max = 0;
    own.output.forEach((x, i) => { max = Math.max(max, Math.abs(x - preset.output[i])); });
    const n = MOD_SHAPE[2];
    heatmap($("mod-heatmap"), MOD_DOCS.map((d, i) => `${i} (doc ${d})`), own.weights.slice(0, n * n));
    $("mod-result").textContent =
      `output ${own.shape.join("×")} in ${own.ms.toFixed(1)} ms; against the documents preset: max |diff| ${fmt(max)} ` +
      `(the preset against the f64 reference: rel ${fmt(preset.reference.output_rel)})`;
    state.mods = { role, max_abs_diff: max, preset_rel: preset.reference.output_rel };
  } catch (e) {
    $("mod-result").textContent = `error: ${e.message ?? e}`;
    state.mods = { role, error: String(e.message ?? e) };
  }
  $("mod-run").disabled = false;
}

async function runVerify(session) {
  $("verify-run").disabled = true;
  const body = $("verify-table").tBodies[0];
  body.innerHTML = "";
  const total = session.verify_len();
  $("verify-progress").max = total;
  let failed = 0, maxRel = 0;
  const results = [];
  for (let i = 0; i < total; i++) {
    let r;
    try {
      r = JSON.parse(await session.verify_case(i));
    } catch (e) {
      r = { case: `case ${i}`, passed: false, error: String(e.message ?? e) };
    }
    results.push(r);
    if (!r.passed) failed++;
    const rels = [r.context_rel, r.weights_rel].filter((x) => x !== undefined);
    // A NaN comes through JSON as null: count it as an infinite error.
    for (const x of rels) maxRel = Math.max(maxRel, x === null ? Infinity : x);
    const row = body.insertRow();
    const cells = r.error
      ? [r.case, `error: ${r.error}`]
      : [r.case, fmt(r.context_max), fmt(r.context_rel), fmt(r.weights_max), fmt(r.weights_rel), fmt(r.tolerance)];
    for (const c of cells) row.insertCell().textContent = c;
    if (r.error) row.cells[1].colSpan = 5;
    const res = row.insertCell();
    res.textContent = r.passed ? "pass" : "FAIL";
    res.className = r.passed ? "pass" : "fail";
    $("verify-progress").value = i + 1;
    $("verify-summary").textContent = `${i + 1}/${total}, ${failed} failed`;
  }
  const verdict = failed === 0 ? "PASS" : "FAIL";
  const summary = failed === 0
    ? `verify: PASS ${total} cases, max rel err ${maxRel.toExponential(2)}`
    : `verify: FAIL ${failed} of ${total} cases, max rel err ${maxRel.toExponential(2)}`;
  state.verify = { verdict, total, failed, maxRel, results };
  $("verify-summary").textContent = summary;
  $("verify-run").disabled = false;
  return summary;
}

async function runBench(session) {
  $("bench-run").disabled = true;
  const sizes = $("bench-sizes").value.split(",").map((s) => parseInt(s, 10)).filter((n) => n > 0);
  const repeats = Math.max(1, parseInt($("bench-repeats").value, 10) || 1);
  const body = $("bench-table").tBodies[0];
  body.innerHTML = "";
  state.bench = [];
  const jobs = ["attention", "layer"].flatMap((kind) => sizes.map((n) => [kind, n]));
  $("bench-progress").max = jobs.length;
  $("bench-progress").value = 0;
  for (const [i, [kind, n]] of jobs.entries()) {
    $("bench-status").textContent = `${kind} n=${n}…`;
    try {
      const p = JSON.parse(await session.bench(kind, n, repeats));
      state.bench.push(p);
      const row = body.insertRow();
      for (const c of [kind, n, p.gpu_ms.toFixed(2), p.cpu_ms.toFixed(2), p.gpu_gflops.toFixed(2),
        p.cpu_gflops.toFixed(2), (p.cpu_ms / p.gpu_ms).toFixed(2) + "×", fmt(p.max_abs_diff)]) {
        row.insertCell().textContent = c;
      }
      chart($("chart"), state.bench);
    } catch (e) {
      body.insertRow().insertCell().textContent = `${kind} n=${n}: error: ${e.message ?? e}`;
    }
    $("bench-progress").value = i + 1;
  }
  $("bench-status").textContent = `done: ${jobs.length} points`;
  $("bench-run").disabled = false;
}

async function main() {
  await init();
  if (!has_webgpu()) {
    noWebGpu("navigator.gpu is undefined: WebGPU is off or unsupported in this browser.");
    return;
  }
  let session;
  try {
    session = await open(params.get("limits") === "default");
  } catch (e) {
    noWebGpu(`WebGPU is there, but no adapter could be opened: ${e.message ?? e}`);
    return;
  }
  state.info = JSON.parse(session.info());
  if (!state.info.name) state.info.name = await browserAdapterName();
  showAdapter(state.info);
  state.f16 = await session.f16_status();
  // A fact of the adapter, not an error: most browsers' software adapters lack shader-f16.
  const hasF16 = (state.info.features ?? []).includes("SHADER_F16");
  $("adapter-f16").textContent = !hasF16
    ? "f16 operands: not offered by this adapter (no shader-f16); f32 runs as usual"
    : state.f16 === "runs"
      ? "f16 operands: supported"
      : `f16 operands: offered, but a small f16 call failed: ${state.f16}`;
  state.sdpa = async (request) => JSON.parse(await session.sdpa(JSON.stringify(request)));
  for (const id of ["demo-run", "mod-run", "verify-run", "bench-run"]) $(id).disabled = false;
  $("demo-form").addEventListener("submit", (ev) => { ev.preventDefault(); runDemo(session); });
  $("mod-form").addEventListener("submit", (ev) => { ev.preventDefault(); runModifiers(); });
  $("verify-run").addEventListener("click", () => runVerify(session));
  $("bench-run").addEventListener("click", () => runBench(session));
  await runDemo(session);
  await runModifiers();
  if (params.has("verify")) {
    document.title = await runVerify(session);
  } else if (params.has("bench")) {
    if (params.get("bench")) $("bench-sizes").value = params.get("bench");
    await runBench(session);
    document.title = `bench: ${$("bench-status").textContent}`;
  } else {
    document.title = "wgpu-attention: demo ready";
  }
}

main().catch((e) => {
  state.error = String(e.message ?? e);
  document.title = `error: ${state.error}`;
});
