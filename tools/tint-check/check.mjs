// Tint's validation of WGSL files (the WGSL compiler of Chrome and Dawn: parser, resolver and
// uniformity analysis), through dawn.node's null backend: no GPU, no Vulkan driver.
//
//   node tools/tint-check/check.mjs [--planted DIR] PATH...
//
// PATH: .wgsl files, or directories searched for them. Each file is compiled on a device with
// `shader-f16` and `subgroups`; any message from `getCompilationInfo()` (error, warning or
// info) fails it. Files that call subgroup builtins get `enable subgroups;` prepended here
// (Tint requires it; naga 30 refuses the line, so the crate's sources cannot carry it). Files
// that enable `wgpu_cooperative_matrix` are skipped and counted: Dawn has no such extension.
//
// --planted DIR, first: the gate's self-test. Every `*.bad.wgsl` in DIR must be rejected with
// a message about uniformity, and every `*.good.wgsl` (the same code with the offending call
// moved into uniform control flow) accepted; otherwise the check fails before any PATH is
// read, since a gate that lets a planted divergent barrier through proves nothing. Then, for
// every PATH file that passes and has a `workgroupBarrier();` in its entry point's body, the
// same file with that barrier moved under `if lid.x == 0u` (lid: local_invocation_id) must be
// rejected too: the analysis is proved on each of our kernels, not only on a toy.
//
// Exit status: 0 all pass, 1 a file fails (or the self-test does), 2 usage or setup errors.

import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);

const SUBGROUP_USE = /\bsubgroup[A-Z]\w*\s*\(|@builtin\(\s*subgroup_(invocation_id|size)\s*\)/;
const COOP = /^\s*enable\s+[^;]*\bwgpu_cooperative_matrix\b/m;

function usage(msg) {
  console.error(`tint-check: ${msg}\nusage: node check.mjs [--planted DIR] PATH...`);
  process.exit(2);
}

function wgslFiles(path) {
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path, { withFileTypes: true })
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    .flatMap((e) => {
      const p = join(path, e.name);
      if (e.isDirectory()) return wgslFiles(p);
      return e.name.endsWith('.wgsl') ? [p] : [];
    });
}

// dawn.node's instance and adapter, held for the whole run: the device's threads crash the
// process when the garbage collector frees them under it.
const held = [];

async function openDevice() {
  const gpu = create(['backend=null']);
  const adapter = await gpu.requestAdapter();
  held.push(gpu, adapter);
  if (!adapter) usage("dawn.node's null backend offers no adapter");
  const want = ['shader-f16', 'subgroups'];
  const missing = want.filter((f) => !adapter.features.has(f));
  if (missing.length) usage(`the null adapter lacks ${missing.join(', ')}`);
  const device = await adapter.requestDevice({ requiredFeatures: want });
  return device;
}

// Compiles `source`; returns Tint's messages as lines (empty: clean).
async function compile(device, source) {
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ code: source });
  const info = await module.getCompilationInfo();
  const scopeError = await device.popErrorScope();
  const lines = info.messages.map(
    (m) => `${m.type} ${m.lineNum}:${m.linePos}: ${m.message.split('\n')[0]}`,
  );
  if (scopeError && lines.length === 0) lines.push(`error: ${scopeError.message.split('\n')[0]}`);
  return lines;
}

// The text Tint is given: `enable subgroups;` prepended where subgroup builtins are used.
function forTint(text) {
  return SUBGROUP_USE.test(text) ? `enable subgroups;\n${text}` : text;
}

// `text` with the first `workgroupBarrier();` of its entry point's body moved under an `if`
// on local_invocation_id (the entry point's own parameter, or one added for it); null where
// the entry point's body has no barrier.
function plantBarrier(text) {
  const compute = text.search(/@compute\b/);
  if (compute < 0) return null;
  const open = text.indexOf('(', text.indexOf('fn ', compute));
  let depth = 0;
  let close = open;
  for (; close < text.length; close++) {
    if (text[close] === '(') depth++;
    if (text[close] === ')' && --depth === 0) break;
  }
  const start = text.indexOf('{', close);
  depth = 0;
  let end = start;
  for (; end < text.length; end++) {
    if (text[end] === '{') depth++;
    if (text[end] === '}' && --depth === 0) break;
  }
  const barrier = text.indexOf('workgroupBarrier();', start);
  if (barrier < 0 || barrier > end) return null;
  const params = text.slice(open + 1, close);
  const own = params.match(/@builtin\(\s*local_invocation_id\s*\)\s*(\w+)/);
  const lid = own ? own[1] : 'planted_lid';
  const head = own
    ? text.slice(0, close)
    : `${text.slice(0, open + 1)}@builtin(local_invocation_id) planted_lid: vec3<u32>,${params}`;
  return (
    head +
    text.slice(close, barrier) +
    `if ${lid}.x == 0u { workgroupBarrier(); }` +
    text.slice(barrier + 'workgroupBarrier();'.length)
  );
}

async function selfTest(device, dir) {
  const files = readdirSync(dir).filter((n) => n.endsWith('.wgsl')).sort();
  const bad = files.filter((n) => n.endsWith('.bad.wgsl'));
  const good = files.filter((n) => n.endsWith('.good.wgsl'));
  if (bad.length === 0) usage(`${dir} has no *.bad.wgsl file`);
  let ok = true;
  for (const name of bad) {
    const lines = await compile(device, forTint(readFileSync(join(dir, name), 'utf8')));
    const uniformity = lines.some((l) => l.startsWith('error') && /uniform/i.test(l));
    console.log(`  planted ${name}: ${uniformity ? 'rejected, as it must be' : 'ACCEPTED'}`);
    for (const l of lines) console.log(`    ${l}`);
    ok &&= uniformity;
  }
  for (const name of good) {
    const lines = await compile(device, forTint(readFileSync(join(dir, name), 'utf8')));
    console.log(`  control ${name}: ${lines.length === 0 ? 'accepted, as it must be' : 'REJECTED'}`);
    for (const l of lines) console.log(`    ${l}`);
    ok &&= lines.length === 0;
  }
  console.log(
    `tint self-test: ${bad.length} planted divergent file(s) rejected for uniformity, ` +
      `${good.length} uniform control(s) accepted: ${ok ? 'ok' : 'FAILED'}`,
  );
  return ok;
}

async function main() {
  const args = process.argv.slice(2);
  let planted = null;
  if (args[0] === '--planted') {
    planted = args[1] ?? usage('--planted needs a directory');
    args.splice(0, 2);
  }
  if (args.length === 0) usage('no PATH given');
  const device = await openDevice();
  const start = performance.now();

  if (planted !== null && !(await selfTest(device, planted))) {
    console.error('tint-check: the self-test failed: Tint let a planted divergent barrier through');
    process.exit(1);
  }

  const files = args.flatMap(wgslFiles);
  if (files.length === 0) usage('no .wgsl file under the given paths');
  let passed = 0;
  let withSubgroups = 0;
  const skipped = [];
  const failed = [];
  let plantedCaught = 0;
  const plantedMissed = [];
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    if (COOP.test(text)) {
      skipped.push(file);
      continue;
    }
    const source = forTint(text);
    if (source !== text) withSubgroups += 1;
    const lines = await compile(device, source);
    if (lines.length === 0) {
      passed += 1;
      // The self-test on our own kernels: the same file with a barrier made divergent.
      const bad = planted === null ? null : plantBarrier(source);
      if (bad !== null) {
        const caught = (await compile(device, bad)).some(
          (l) => l.startsWith('error') && /workgroupBarrier.*uniform control flow/.test(l),
        );
        if (caught) plantedCaught += 1;
        else plantedMissed.push(file);
      }
    } else {
      failed.push(file);
      console.log(`FAIL ${file}`);
      for (const l of lines.slice(0, 10)) console.log(`    ${l}`);
      if (lines.length > 10) console.log(`    ... ${lines.length - 10} more`);
    }
  }
  const secs = ((performance.now() - start) / 1000).toFixed(1);
  console.log(
    `tint: ${files.length} files checked, ${passed} passed with no message ` +
      `(${withSubgroups} with \`enable subgroups;\` prepended), ${failed.length} failed, ` +
      `${skipped.length} skipped (wgpu_cooperative_matrix: Dawn has no such extension) in ${secs} s`,
  );
  if (planted !== null) {
    console.log(
      `tint self-test on the kernels: a barrier planted under \`if lid.x == 0u\` in the entry ` +
        `point of each passing file that has one: ${plantedCaught} rejected for uniformity, ` +
        `${plantedMissed.length} accepted`,
    );
    for (const f of plantedMissed) console.log(`  PLANTED BARRIER ACCEPTED: ${f}`);
  }
  process.exit(failed.length === 0 && plantedMissed.length === 0 ? 0 : 1);
}

await main();
