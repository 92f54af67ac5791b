//! The fuzz targets' bodies (src/fuzz.rs) on stable, with no GPU: every seed and every crash
//! that `cargo fuzz` ever found (tests/fuzz/seeds/<target>, tests/fuzz/regressions/<target>)
//! replayed, then a bounded run of seeded random mutations of the seeds. A panic fails the
//! test; the bytes that caused it are written next to the test output to add to
//! regressions/. The coverage-guided run is `cargo +nightly fuzz run --fuzz-dir tests/fuzz
//! <target>` (README, "Fuzzing").

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 3] = [
    ("npy", wgpu_attention::fuzz::npy),
    ("config", wgpu_attention::fuzz::config),
    ("safetensors", wgpu_attention::fuzz::safetensors),
];

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    ["seeds", "regressions"]
        .iter()
        .flat_map(|kind| files(&root.join(kind).join(target)))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Runs `target` on `data`; on a panic, saves the bytes and fails naming them.
fn run(name: &str, target: Target, data: &[u8], what: &str) {
    if std::panic::catch_unwind(|| target(data)).is_err() {
        let path = std::env::temp_dir().join(format!("fuzz-crash-{name}-{}", data.len()));
        std::fs::write(&path, data).unwrap();
        panic!(
            "{name} panicked on {what}; bytes saved to {}",
            path.display()
        );
    }
}

#[test]
fn every_seed_and_saved_crash_runs_without_panicking() {
    for (name, target) in TARGETS {
        let inputs = inputs(name);
        assert!(!inputs.is_empty(), "no seeds for {name}");
        for (path, data) in &inputs {
            run(name, target, data, path);
        }
    }
}

#[test]
fn bounded_random_mutations_of_the_seeds_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(0xf022);
    for (name, target) in TARGETS {
        let seeds = inputs(name);
        for round in 0..1500 {
            let (_, seed) = &seeds[round % seeds.len()];
            let mut data = seed.clone();
            for _ in 0..rng.random_range(1..=4) {
                match rng.random_range(0..4) {
                    0 if !data.is_empty() => {
                        let i = rng.random_range(0..data.len());
                        data[i] = rng.random();
                    }
                    1 if !data.is_empty() => {
                        let i = rng.random_range(0..data.len());
                        data.truncate(i);
                    }
                    2 => data.push(rng.random()),
                    _ => {
                        // Digits are where .npy headers keep shapes: make them large.
                        if let Some(i) = data.iter().position(|b| b.is_ascii_digit()) {
                            data.splice(i..i, *b"99999");
                        }
                    }
                }
            }
            run(name, target, &data, &format!("mutation {round}"));
        }
    }
}
