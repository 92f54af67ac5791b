// The browser test: serves web/dist on 127.0.0.1, drives Debian's chromium headless with
// WebGPU on (Dawn on SwiftShader where there is no GPU) through playwright-core, and fails
// unless
//   - the demo's weights equal the native CLI's (`wgpu-attention demo --out DIR`, given as
//     WEIGHTS=DIR/weights.npy) within 1e-5, and its difference from the reference is small;
//   - `index.html?verify` ends with `verify: PASS <cases> cases, max rel err <x>`, at least
//     10 cases, every case passed and x ≤ 1e-5;
//   - the benchmark (`?bench=64,128`) finishes every point;
//   - `wgpuAttention.sdpa` (the crate's `Session::sdpa`) with modifiers: a sliding-window
//     preset equals attention computed here in f64 and the crate's reference (rel err
//     < 1e-5); a caller's own `mask_mod` reading an i32 buffer equals the documents preset
//     (< 1e-6); a `score_mod` with a syntax error rejects naming its line; one declaring a
//     binding is refused; and the page's own modifiers example matches the preset.
// Saves screenshots of the demo and the benchmark into SHOTS (default web/test/shots).
//
// Usage: WEIGHTS=/path/weights.npy node web/test/run.mjs

import { createServer } from "node:http";
import { readFile, mkdir } from "node:fs/promises";
import { join, extname, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const dist = resolve(here, "..", "dist");
const shots = resolve(process.env.SHOTS ?? join(here, "shots"));
const weightsPath = process.env.WEIGHTS;
const browserPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const TOL = 1e-5;

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm", ".css": "text/css" };

function fail(msg) {
  console.error(`FAIL: ${msg}`);
  process.exitCode = 1;
}

/** A float32 or float64 little-endian C-order .npy: [shape, values]. */
function readNpy(buf) {
  if (buf.toString("latin1", 1, 6) !== "NUMPY") throw new Error("not a .npy file");
  const major = buf[6];
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString("latin1", start, start + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  if (/'fortran_order':\s*True/.test(header)) throw new Error("fortran order");
  const data = buf.subarray(start + hlen);
  const ab = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
  const values = descr === "<f4" ? new Float32Array(ab) : descr === "<f8" ? new Float64Array(ab) : null;
  if (!values) throw new Error(`unsupported dtype ${descr}`);
  return [shape, Array.from(values)];
}

/** `{shape, data}` of `shape` with deterministic values in [-1, 1]. */
function tensor(shape, seed) {
  const n = shape.reduce((a, b) => a * b);
  return { shape, data: Array.from({ length: n }, (_, i) => Math.sin(0.61 * i + 1.7 * seed) * Math.cos(0.23 * i * seed)) };
}

/** Attention in f64 over q (B, H, L, E) and k, v (B, H_kv, S, E | E_v), grouped-query when
 * H_kv < H, scale 1/sqrt(E); `visible(b, h, i, j)` false hides key j from query i. A row
 * that sees nothing is 0. */
function attention(q, k, v, visible) {
  const [B, H, L, E] = q.shape, [, Hk, S] = k.shape, Ev = v.shape[3];
  const scale = 1 / Math.sqrt(E);
  const out = new Float64Array(B * H * L * Ev);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) {
    const g = Math.floor(h / (H / Hk));
    for (let i = 0; i < L; i++) {
      const t = [];
      for (let j = 0; j < S; j++) {
        if (!visible(b, h, i, j)) { t.push(-Infinity); continue; }
        let dot = 0;
        for (let e = 0; e < E; e++) dot += q.data[((b * H + h) * L + i) * E + e] * k.data[((b * Hk + g) * S + j) * E + e];
        t.push(dot * scale);
      }
      const m = Math.max(...t);
      if (m === -Infinity) continue;
      const w = t.map((x) => Math.exp(x - m));
      const sum = w.reduce((a, x) => a + x, 0);
      for (let e = 0; e < Ev; e++) {
        let acc = 0;
        for (let j = 0; j < S; j++) acc += (w[j] / sum) * v.data[((b * Hk + g) * S + j) * Ev + e];
        out[((b * H + h) * L + i) * Ev + e] = acc;
      }
    }
  }
  return Array.from(out);
}

/** ‖a − b‖₂ / ‖b‖₂ (the crate's `reference::compare`); Infinity for different lengths or NaN. */
function relErr(a, b) {
  if (a.length !== b.length) return Infinity;
  let d = 0, r = 0;
  a.forEach((x, i) => { d += (x - b[i]) ** 2; r += b[i] ** 2; });
  const e = Math.sqrt(d / r);
  return Number.isNaN(e) ? Infinity : e;
}

/** `wgpuAttention.sdpa(request)` in the page: `{ result }` or `{ error }` (its message). */
function sdpa(page, request) {
  return page.evaluate(async (r) => {
    try {
      return { result: await window.wgpuAttention.sdpa(r) };
    } catch (e) {
      return { error: String(e?.message ?? e) };
    }
  }, request);
}

/** The checks of `Session::sdpa` with modifiers, on a page whose session is open. */
async function modifierChecks(page) {
  // (a) A sliding window [4, 2] with grouped-query attention (2 query heads, 1 K/V head).
  const q = tensor([1, 2, 20, 8], 1), k = tensor([1, 1, 20, 8], 2), v = tensor([1, 1, 20, 8], 3);
  const win = await sdpa(page, { q, k, v, presets: [{ window: [4, 2] }], reference: true });
  if (win.error) fail(`sdpa with a window preset: ${win.error}`);
  else {
    const want = attention(q, k, v, (b, h, i, j) => j - i >= -4 && j - i <= 2);
    const rel = relErr(win.result.output, want);
    const crate = win.result.reference?.output_rel;
    // The window must matter, or this would prove nothing.
    const full = relErr(attention(q, k, v, () => true), want);
    console.log(`sdpa window [4,2], GQA 2:1: rel err vs f64 here ${rel.toExponential(2)}, vs the crate's reference ${crate?.toExponential(2)} (unmasked differs by ${full.toExponential(2)})`);
    if (win.result.shape.join() !== "1,2,20,8") fail(`sdpa window: shape ${win.result.shape}`);
    if (!(rel < TOL) || !(crate < TOL)) fail(`sdpa window: rel err ${rel} here, ${crate} from the crate's reference`);
    if (!(full > 1e-2)) fail("sdpa window: the window changed nothing");
  }

  // (b) A caller's mask_mod reading document ids from an i32 buffer against the preset.
  const ids = [[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4], [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3]];
  const [q2, k2, v2] = [tensor([2, 2, 20, 8], 4), tensor([2, 2, 20, 8], 5), tensor([2, 2, 20, 8], 6)];
  const own = await sdpa(page, {
    q: q2, k: k2, v: v2, reference: true,
    mask_mod: {
      origin: "documents.wgsl",
      wgsl: "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    let row = b * 20u;\n    return doc[row + q] == doc[row + kv];\n}\n",
    },
    buffers: [{ name: "doc", i32: ids.flat() }],
  });
  const preset = await sdpa(page, { q: q2, k: k2, v: v2, presets: [{ documents: ids }] });
  if (own.error || preset.error) fail(`sdpa documents: ${own.error ?? preset.error}`);
  else {
    const rel = relErr(own.result.output, preset.result.output);
    const want = attention(q2, k2, v2, (b, h, i, j) => ids[b][i] === ids[b][j]);
    const full = relErr(attention(q2, k2, v2, () => true), want);
    console.log(`sdpa own mask_mod (i32 buffer) vs the documents preset: rel diff ${rel.toExponential(2)}; vs f64 here ${relErr(own.result.output, want).toExponential(2)} (unmasked differs by ${full.toExponential(2)})`);
    console.log(`  reference for own WGSL: ${own.result.reference_skipped}`);
    if (!(rel < 1e-6)) fail(`sdpa own mask_mod and the documents preset differ: ${rel}`);
    if (!(relErr(own.result.output, want) < TOL)) fail("sdpa own mask_mod differs from f64 here");
    if (!(full > 1e-2)) fail("sdpa documents: the mask changed nothing");
    if (!own.result.reference_skipped) fail("sdpa: the reference of a caller's own WGSL was neither run nor said skipped");
  }

  // (c) A syntax error on line 3 of a caller's score_mod.
  const bad = await sdpa(page, {
    q, k, v,
    score_mod: {
      origin: "bad_score.wgsl",
      wgsl: "// doubles the score\nfn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    return score *+ 2.0 +;\n}\n",
    },
  });
  console.log(`sdpa score_mod with a syntax error: ${bad.error ?? "resolved"}`);
  if (!/^invalid modifier: bad_score\.wgsl:3:\d+: /.test(bad.error ?? "")) fail(`sdpa syntax error: ${bad.error ?? "resolved"}`);

  // (d) A caller's modifier declaring a binding of its own.
  const bound = await sdpa(page, {
    q, k, v,
    score_mod: {
      origin: "bound.wgsl",
      wgsl: "@group(0) @binding(0) var<storage, read> table: array<f32>;\nfn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    return score + table[h];\n}\n",
    },
  });
  console.log(`sdpa score_mod declaring a binding: ${bound.error ?? "resolved"}`);
  if (!/may not declare `var table`/.test(bound.error ?? "")) fail(`sdpa binding: ${bound.error ?? "resolved"}`);

  // The page's own example: its mask_mod against the preset.
  const m = await page.evaluate(() => window.wgpuAttention.mods);
  console.log(`page modifiers example: ${m?.error ?? `${m?.role} vs the documents preset max |diff| ${m?.max_abs_diff?.toExponential(2)}, preset vs reference ${m?.preset_rel?.toExponential(2)}`}`);
  if (!m || m.error || !(m.max_abs_diff <= 1e-6) || !(m.preset_rel < TOL)) fail(`page modifiers example: ${JSON.stringify(m)}`);
}

function serve() {
  const server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    const file = resolve(dist, "." + (path.endsWith("/") ? path + "index.html" : path));
    if (!file.startsWith(dist)) { res.writeHead(403).end(); return; }
    try {
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" }).end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok(server)));
}

async function waitTitle(page, prefixes, timeoutMs) {
  await page.waitForFunction(
    (ps) => ps.some((p) => document.title.startsWith(p)),
    prefixes,
    { timeout: timeoutMs, polling: 250 },
  );
  return page.title();
}

async function main() {
  await mkdir(shots, { recursive: true });
  const server = await serve();
  const base = `http://127.0.0.1:${server.address().port}/index.html`;
  const browser = await chromium.launch({
    executablePath: browserPath,
    headless: true,
    args: [
      "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
      "--use-angle=swiftshader", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-quic",
    ],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1000, height: 900 } });
    page.on("console", (m) => { if (m.type() === "error") console.error(`[page] ${m.text()}`); });
    page.on("pageerror", (e) => console.error(`[page error] ${e.message}`));

    // The demo.
    await page.goto(base);
    const title = await waitTitle(page, ["wgpu-attention: demo ready", "no WebGPU", "error"], 120_000);
    console.log(`demo page: ${title}`);
    console.log(`adapter: ${await page.textContent("#adapter-summary")}`);
    const info = await page.evaluate(() => window.wgpuAttention.info);
    if (info) {
      console.log(`  features: ${info.features.join(", ")}`);
      console.log(`  limits: ${info.limits.map(([k, v]) => `${k} ${v}`).join(", ")}`);
    }
    // f16 where the adapter has no shader-f16: the library's error, and the page goes on.
    const f16 = await page.evaluate(() => window.wgpuAttention.f16);
    console.log(`f16 operands: ${f16}`);
    const hasF16 = info?.features.includes("SHADER_F16");
    // wgpu names no adapter in the browser: the error names the backend instead.
    const refused = /^adapter "BrowserWebGpu adapter" does not support .*SHADER_F16/;
    if (hasF16 ? f16 !== "runs" : !refused.test(f16 ?? "")) fail(`f16 status: ${f16}`);
    const demo = await page.evaluate(() => window.wgpuAttention.demo);
    await page.screenshot({ path: join(shots, "page.png") });
    await page.locator("#demo").screenshot({ path: join(shots, "demo.png") });
    if (!demo || demo.error) {
      fail(`the demo did not run: ${demo?.error ?? title}`);
    } else {
      console.log(`demo: weights max abs vs reference ${demo.weights_max.toExponential(2)}, rel ${demo.weights_rel.toExponential(2)}`);
      if (!(demo.weights_rel <= TOL)) fail(`demo weights rel err ${demo.weights_rel} > ${TOL}`);
      if (weightsPath) {
        const [shape, native] = readNpy(await readFile(weightsPath));
        const n = demo.words.length;
        if (shape.join() !== [n, n].join()) fail(`native weights shape ${shape}, browser ${n}x${n}`);
        let max = 0;
        native.forEach((v, i) => { max = Math.max(max, Math.abs(v - demo.weights[i])); });
        console.log(`demo: browser vs native CLI weights max abs diff ${max.toExponential(2)}`);
        if (!(max <= TOL) || native.length !== demo.weights.length) fail(`browser and native demo weights differ by ${max}`);
      } else {
        fail("WEIGHTS (the native demo's weights.npy) not given");
      }
    }

    // Attention with modifiers through `Session::sdpa`.
    await modifierChecks(page);
    await page.locator("#modifiers").screenshot({ path: join(shots, "modifiers.png") });

    // The verify sweep.
    const t0 = Date.now();
    await page.goto(`${base}?verify`);
    const verdict = await waitTitle(page, ["verify:", "no WebGPU", "error"], 540_000);
    console.log(`${verdict}  (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
    const v = await page.evaluate(() => window.wgpuAttention.verify);
    const m = /^verify: PASS (\d+) cases, max rel err (\S+)$/.exec(verdict);
    if (!m) fail(`verify did not pass: ${verdict}`);
    else {
      if (Number(m[1]) < 10) fail(`only ${m[1]} verify cases`);
      if (!(Number(m[2]) <= TOL)) fail(`max rel err ${m[2]} > ${TOL}`);
    }
    for (const r of v?.results ?? []) if (!r.passed) console.error(`  failed: ${r.case} ${r.error ?? ""}`);
    await page.locator("#verify").screenshot({ path: join(shots, "verify.png") });

    // The same sweep on a device with WebGPU's default limits (256 invocations per
    // workgroup, 16 KiB of workgroup memory): the variants that fit must be chosen.
    await page.goto(`${base}?verify&limits=default`);
    const small = await waitTitle(page, ["verify:", "no WebGPU", "error"], 540_000);
    const lim = await page.evaluate(() => Object.fromEntries(window.wgpuAttention.info.limits));
    console.log(`default limits (invocations ${lim.max_compute_invocations_per_workgroup}, workgroup storage ${lim.max_compute_workgroup_storage_size}): ${small}`);
    const ms = /^verify: PASS (\d+) cases, max rel err (\S+)$/.exec(small);
    if (!ms || !(Number(ms[2]) <= TOL)) fail(`verify with default limits: ${small}`);
    if (lim.max_compute_invocations_per_workgroup !== 256) fail("default limits were not in force");

    // The benchmark, small sizes.
    await page.goto(`${base}?bench=64,128,256`);
    const b = await waitTitle(page, ["bench:", "no WebGPU", "error"], 300_000);
    console.log(b);
    const points = await page.evaluate(() => window.wgpuAttention.bench);
    if (points.length !== 6) fail(`benchmark: ${points.length} of 6 points`);
    for (const p of points) {
      console.log(`  ${p.kind} n=${p.n}: GPU ${p.gpu_gflops.toFixed(2)} GFLOP/s, CPU ${p.cpu_gflops.toFixed(2)} GFLOP/s, max |diff| ${p.max_abs_diff.toExponential(1)}`);
      if (!(p.max_abs_diff <= 1e-3)) fail(`benchmark ${p.kind} n=${p.n}: GPU and CPU differ by ${p.max_abs_diff}`);
    }
    await page.locator("#bench").screenshot({ path: join(shots, "bench.png") });
    console.log(`screenshots in ${shots}`);
  } finally {
    await browser.close();
    server.close();
  }
  console.log(process.exitCode ? "browser test FAILED" : "browser test passed");
}

main().catch((e) => { console.error(e); process.exitCode = 1; });
