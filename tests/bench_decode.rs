//! `wgpu-attention bench --decode` prints, per batch and cache length, the KV-cache decode,
//! the whole-call sdpa and the one-thread CPU decode with their tokens per second.

mod common;

#[test]
fn bench_decode_prints_all_three_paths_with_tokens_per_second() {
    let out = common::cli(&[
        "bench",
        "--decode",
        "--n",
        "5,9",
        "--decode-batch",
        "1,2",
        "--decode-heads",
        "2",
        "--d",
        "6",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]);
    let stdout = common::ok(&out);
    assert!(stdout.contains("tokens/s"), "{stdout}");
    for path in [
        "gpu kv-cache decode",
        "gpu whole-call sdpa",
        "cpu f32 one thread",
    ] {
        // One line per (batch, length).
        assert_eq!(stdout.matches(path).count(), 4, "{path}:\n{stdout}");
    }
    assert!(stdout.contains("decode_partial"), "{stdout}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("gpu kv-cache decode"))
        .collect();
    assert!(lines[3].trim_start().starts_with("2 "), "{}", lines[3]);
}

#[test]
fn bench_decode_runs_an_f16_cache() {
    let out = common::cli(&[
        "bench",
        "--decode",
        "--decode-dtype",
        "f16",
        "--n",
        "7",
        "--decode-batch",
        "1",
        "--decode-heads",
        "2",
        "--d",
        "5",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--no-cpu",
    ]);
    let stdout = common::ok(&out);
    assert!(stdout.contains("f16 K and V"), "{stdout}");
    assert_eq!(stdout.matches("gpu kv-cache decode").count(), 1, "{stdout}");
    assert!(!stdout.contains("cpu f32 one thread"), "{stdout}");
}

#[test]
fn bench_decode_rejects_an_empty_batch_list() {
    let out = common::cli(&["bench", "--decode", "--decode-batch", "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
