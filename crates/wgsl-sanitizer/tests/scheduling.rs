//! Adversarial scheduling: a racy kernel's result depends on the seed (and its findings name
//! the seed), a clean kernel's does not, a lost update shows up as a wrong value under
//! switches at memory accesses, and the lanes of one subgroup run apart where it shows.

use std::collections::BTreeSet;

use wgsl_sanitizer::{Dispatch, FindingKind, Report, Resource, Schedule, Shader};

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs `src` over one workgroup with `out` (group 0 binding 0) of `words` zeroed words;
/// returns the report and `out`.
fn run(src: &str, lanes: u32, seed: u64, schedule: Schedule, words: usize) -> (Report, Vec<u32>) {
    let shader = Shader::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let mut d = Dispatch::new("main", [1, 1, 1]);
    d.subgroup_size = lanes;
    d.seed = seed;
    d.schedule = schedule;
    d.bind(0, 0, Resource::Buffer(vec![0; 4 * words]));
    let report = shader.run(&mut d).unwrap_or_else(|e| panic!("{e}"));
    let out = u32s(d.buffer(0, 0).unwrap());
    (report, out)
}

/// Asserts that `report` (run under `seed`) has a finding of `kind` that names the seed.
fn assert_found(report: &Report, kind: FindingKind, seed: u64) {
    let f = report
        .findings
        .iter()
        .find(|f| f.kind == kind)
        .unwrap_or_else(|| panic!("no {kind:?} under seed {seed}:\n{report}"));
    assert_eq!((f.seed, report.seed), (seed, seed));
    let text = f.to_string();
    assert!(text.contains(&format!("under seed {seed}")), "{text}");
}

/// Every invocation stores its index into one word: the last store wins.
const LAST_WRITER: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32) {
    out[0] = i + 1u; // RACE
}
";

#[test]
fn a_racy_kernels_result_depends_on_the_seed_and_its_finding_names_the_seed() {
    let mut results = BTreeSet::new();
    for seed in 0..8 {
        let (report, out) = run(LAST_WRITER, 16, seed, Schedule::default(), 1);
        results.insert(out[0]);
        assert_found(&report, FindingKind::StorageRace, seed);
        // The same seed, the same run.
        let (_, again) = run(LAST_WRITER, 16, seed, Schedule::default(), 1);
        assert_eq!(again, out, "seed {seed} twice");
    }
    assert!(results.len() > 1, "one result for eight seeds: {results:?}");
}

/// Barriers, subgroup operations, divergent branches, a `switch`, a loop left by lanes at
/// different iterations, atomics whose total is what is kept: nothing races.
const CLEAN: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> tile: array<u32, 64>;
var<workgroup> total: atomic<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_invocation_id) lane: u32) {
    if i == 0u {
        atomicStore(&total, 0u);
    }
    tile[i] = i * 3u + 1u;
    workgroupBarrier();
    var acc = 0u;
    if (i & 1u) == 0u {
        acc = tile[63u - i];
    } else {
        acc = tile[(i + 5u) % 64u] * 2u;
    }
    switch i % 3u {
        case 0u: { acc += 7u; }
        case 1u, 2u: { acc ^= 5u; }
        default: {}
    }
    var k = 0u;
    loop {
        if k >= i % 5u { break; }
        acc += tile[(i + k) % 64u];
        k += 1u;
    }
    acc += subgroupAdd(acc) + subgroupBroadcastFirst(lane);
    atomicAdd(&total, acc);
    out[i] = acc;
    workgroupBarrier();
    if i == 0u {
        out[64] = atomicLoad(&total);
    }
}
";

#[test]
fn a_clean_kernel_gives_the_same_result_under_every_seed() {
    for lanes in [16, 32, 64] {
        let (first, want) = run(CLEAN, lanes, 0, Schedule::default(), 65);
        assert!(first.findings.is_empty(), "{lanes} lanes:\n{first}");
        for seed in 1..8 {
            let (report, out) = run(CLEAN, lanes, seed, Schedule::default(), 65);
            assert!(
                report.findings.is_empty(),
                "{lanes} lanes, seed {seed}:\n{report}"
            );
            assert_eq!(out, want, "{lanes} lanes, seed {seed}");
        }
    }
}

/// Lane 0 of each subgroup adds one to a workgroup counter four times, by a load and a store
/// (not atomically): between barriers, another subgroup's load and store may fall between.
const LOST_UPDATE: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> counter: u32;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_invocation_id) lane: u32) {
    if i == 0u {
        counter = 0u;
    }
    workgroupBarrier();
    if lane == 0u {
        for (var n = 0u; n < 4u; n++) {
            let c = counter;
            counter = c + 1u; // LOST
        }
    }
    workgroupBarrier();
    if i == 0u {
        out[0] = counter;
    }
}
";

#[test]
fn a_lost_update_shows_as_a_wrong_value_under_switches_at_memory_accesses() {
    // Four subgroups of 16 lanes: 16 increments.
    let mut wrong = Vec::new();
    for seed in 0..8 {
        let (report, out) = run(LOST_UPDATE, 16, seed, Schedule::default(), 1);
        assert_found(&report, FindingKind::WorkgroupRace, seed);
        if out[0] != 16 {
            wrong.push((seed, out[0]));
        }
        // Switching only at barriers, each subgroup's increments run together: always 16.
        let (_, plain) = run(LOST_UPDATE, 16, seed, Schedule::at_barriers_only(), 1);
        assert_eq!(plain[0], 16, "seed {seed}, switches at barriers only");
    }
    assert!(!wrong.is_empty(), "16 under eight seeds");
    println!("lost updates (seed, count): {wrong:?}");
}

#[test]
fn the_lanes_of_one_subgroup_run_apart_where_it_shows() {
    // One subgroup; in lockstep the last lane's store wins, and the `else` side runs last.
    let store = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) i: u32) {
    out[0] = i;
    if i < 16u {
        out[1] = 1u;
    } else {
        out[1] = 2u;
    }
}
";
    let (_, lockstep) = run(store, 32, 0, Schedule::at_barriers_only(), 2);
    assert_eq!(lockstep, [31, 2]);
    let mut winners = BTreeSet::new();
    let mut sides = BTreeSet::new();
    for seed in 0..8 {
        let (report, out) = run(store, 32, seed, Schedule::default(), 2);
        assert_found(&report, FindingKind::StorageRace, seed);
        winners.insert(out[0]);
        sides.insert(out[1]);
    }
    assert!(
        winners.len() > 1,
        "the same lane's store won under 8 seeds: {winners:?}"
    );
    assert_eq!(sides, BTreeSet::from([1, 2]));
}

#[test]
fn several_seeds_stop_at_the_first_with_an_error() {
    let shader = Shader::parse(CLEAN).unwrap();
    let mut d = Dispatch::new("main", [1, 1, 1]);
    d.seed = 10;
    d.seeds = 4;
    d.bind(0, 0, Resource::Buffer(vec![0; 4 * 65]));
    let report = shader.run(&mut d).unwrap();
    assert!(report.findings.is_empty(), "{report}");
    assert_eq!((report.seed, report.seeds_run), (13, 4));

    let shader = Shader::parse(LAST_WRITER).unwrap();
    let mut d = Dispatch::new("main", [1, 1, 1]);
    d.seed = 10;
    d.seeds = 4;
    d.bind(0, 0, Resource::Buffer(vec![0; 4]));
    let report = shader.run(&mut d).unwrap();
    assert_eq!((report.seed, report.seeds_run), (10, 1));
    assert!(report.findings.iter().all(|f| f.seed == 10), "{report}");
}
