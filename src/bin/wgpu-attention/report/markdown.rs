//! `results.md`: the [`Report`] as a dated, self-describing page, a section after the
//! header for each table (forward, backward, decode, matmul, first call), numbers to about
//! three significant figures.

use std::fmt::Write as _;
use std::time::Duration;

use super::json::Report;

/// `results.md`: the page, dated and self-describing.
pub(super) fn render(r: &Report) -> String {
    let mut s = String::new();
    let date = r.date_utc.get(..10).unwrap_or(&r.date_utc);
    let _ = writeln!(s, "# Results\n");
    let _ = writeln!(
        s,
        "Measured by `wgpu-attention report --out DIR{}` on {date} at {} UTC. Everything \
         below, from the Forward section to the First call section, is what that command \
         wrote (every row is also in `DIR/results.json`).{}\n",
        if r.quick { " --quick" } else { "" },
        r.date_utc.get(11..16).unwrap_or(""),
        if r.quick {
            " **A `--quick` run: small sizes, one timed run each. It checks that every \
             section runs; its numbers are not measurements.**"
        } else {
            ""
        }
    );
    let a = &r.adapter;
    let _ = writeln!(
        s,
        "- Adapter: **{}** ({}, {}; driver {} {})",
        a.name, a.backend, a.device_type, a.driver, a.driver_info
    );
    let _ = writeln!(s, "- CPU: **{}**, {} threads", r.cpu.model, r.cpu.threads);
    let _ = writeln!(
        s,
        "- Build: wgpu-attention {}{}, {} profile",
        r.crate_version,
        r.git_commit
            .as_ref()
            .map_or(String::new(), |c| format!(" at commit `{c}`")),
        r.build_profile
    );
    let torch_threads = r
        .forward
        .pytorch
        .first()
        .or(r.backward.pytorch.first())
        .map_or(0, |t| t.threads);
    let _ = writeln!(
        s,
        "- PyTorch ({}): {}",
        r.pytorch.device.as_deref().unwrap_or("CPU"),
        match (&r.pytorch.version, &r.pytorch.note) {
            (Some(v), _) => format!("{v}, {torch_threads} threads"),
            (None, Some(note)) => note.clone(),
            (None, None) => "not available".into(),
        }
    );
    let _ = writeln!(
        s,
        "- FMA ceiling (`fma_peak.wgsl`, the adapter's f32 multiply-add rate): {} GFLOP/s",
        sig(r.fma_peak_gflops)
    );
    let _ = writeln!(
        s,
        "- Timing: median of {} run{} after {} warm-up, wall clock per call unless said; {}",
        r.repeats,
        if r.repeats == 1 { "" } else { "s" },
        r.warmup,
        r.timing
    );
    let _ = writeln!(
        s,
        "- The whole report took {}{}\n",
        duration(Duration::from_secs_f64(r.duration_s)),
        match r.load_average {
            [Some(a), Some(b)] => format!(
                "; load average (1 min) {a:.1} at its start, {b:.1} at its end{}",
                if a.max(b) > r.cpu.threads as f64 + 0.5 {
                    " (over the CPU's threads: other work shared the machine, so read the \
                     ratios, measured side by side, more than the absolute times)"
                } else {
                    ""
                }
            ),
            _ => String::new(),
        }
    );

    forward_md(&mut s, r);
    backward_md(&mut s, r);
    decode_md(&mut s, r);
    matmul_md(&mut s, r);
    first_call_md(&mut s, r);
    s
}

fn forward_md(s: &mut String, r: &Report) {
    let f = &r.forward;
    let _ = writeln!(s, "## Forward\n");
    let _ = writeln!(
        s,
        "Self-attention with Q = K = V = X, d = {} over {} head(s), batch {}, not causal, through the \
         array API (`Attention::run` on `Inputs::x`: upload, kernels, readback); GPU columns \
         fused (no weights) and with the attention weights returned. A cell is the median \
         time, GFLOP/s (2·n²·(d_k+d_v)) and the one-thread f32 ndarray CPU path's time over \
         the cell's (above 1×: faster than that CPU path). PyTorch: \
         `F.scaled_dot_product_attention` under `torch.inference_mode()`, on the GPU where the \
         adapter is one and torch has one too (each call synchronised), else every CPU thread.\n",
        f.d,
        f.heads,
        f.batch
    );
    let mut paths: Vec<&str> = Vec::new();
    for rec in &f.rows {
        if !paths.contains(&rec.path.as_str()) {
            paths.push(&rec.path);
        }
    }
    let mut head = vec!["n".to_string()];
    head.extend(paths.iter().map(|p| column_name(p)));
    head.push(match f.pytorch.first() {
        Some(t) => t.label("SDPA"),
        None => "PyTorch CPU SDPA".into(),
    });
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    s.push_str(&header(&head));
    let mut ns: Vec<usize> = f.rows.iter().map(|r| r.n).collect();
    ns.dedup();
    for &n in &ns {
        let cpu_ms = f
            .rows
            .iter()
            .find(|x| x.n == n && x.path == "cpu f32 ndarray")
            .map(|x| x.stats.median_ms);
        let mut cells = vec![n.to_string()];
        for p in &paths {
            cells.push(match f.rows.iter().find(|x| x.n == n && x.path == *p) {
                Some(x) if x.path == "cpu f32 ndarray" => {
                    format!("{} ms, {} GFLOP/s", sig(x.stats.median_ms), sig(x.gflops))
                }
                Some(x) => format!(
                    "{} ms, {}{}",
                    sig(x.stats.median_ms),
                    sig(x.gflops),
                    cpu_ms.map_or(String::new(), |c| format!(
                        ", {}",
                        times(c / x.stats.median_ms)
                    ))
                ),
                None if p.starts_with("cpu f64") => "not timed".into(),
                None if f.skipped.iter().any(|l| l.starts_with(*p)) => {
                    "skipped (device limits)".into()
                }
                None => "not timed".into(),
            });
        }
        cells.push(match f.pytorch.iter().find(|t| t.n == n) {
            Some(t) => format!(
                "{} ms, {}{}",
                sig(t.forward_ms),
                sig(2.0 * (n * n * 2 * f.d) as f64 / (t.forward_ms * 1e6)),
                cpu_ms.map_or(String::new(), |c| format!(", {}", times(c / t.forward_ms)))
            ),
            None => r
                .pytorch
                .note
                .clone()
                .unwrap_or_else(|| "not available".into()),
        });
        s.push_str(&row(&cells));
    }
    // The fused kernels' share of the FMA ceiling at the largest n.
    if let Some(&n) = ns.last() {
        let shares: Vec<String> = f
            .rows
            .iter()
            .filter(|x| x.n == n && x.path.ends_with(" fused"))
            .filter_map(|x| {
                x.share_of_fma_peak
                    .map(|p| format!("{} {:.0} %", x.path.trim_start_matches("gpu "), 100.0 * p))
            })
            .collect();
        if !shares.is_empty() {
            let _ = writeln!(
                s,
                "\nAt n = {n}, timed alone (their own time, not the whole call's), the fused \
                 kernels run at this share of the adapter's FMA ceiling: {}.",
                shares.join(", ")
            );
        }
    }
    for line in &f.skipped {
        let _ = writeln!(s, "\nSkipped: `{}`", line.trim());
    }
    not_timed_md(s, &f.not_timed, r.max_call_ms);
    s.push('\n');
}

/// `gpu subgroup +weights` → `GPU subgroup, + weights`, and so on.
fn column_name(path: &str) -> String {
    match path {
        "cpu f32 ndarray" => "CPU f32 ndarray, 1 thread".into(),
        "cpu f64 reference" => "CPU f64 reference".into(),
        p => p
            .replacen("gpu ", "GPU ", 1)
            .replace(" +weights", ", + weights")
            .replace(" fused", ", fused"),
    }
}

fn backward_md(s: &mut String, r: &Report) {
    let b = &r.backward;
    let _ = writeln!(s, "## Backward\n");
    let _ = writeln!(
        s,
        "`sdpa` on Q, K, V of ({}, {}, n, {}), not causal: the fused forward (no weights, \
         `Inputs::qkv`) and `Saved::backward` on a forward saved once (dO's upload, the \
         backward kernels, the gradients' readback). GFLOP/s counts the forward as \
         2·n²·(d_k+d_v) and the backward as 2.5× that; the CPU-time ratio is backward over \
         forward in CPU time of every thread of the process (on a CPU adapter the kernels' \
         own work). PyTorch: `F.scaled_dot_product_attention` with autograd, then \
         `.backward(dO)`, on torch's GPU or CPU as in the forward.\n",
        b.batch,
        b.heads,
        b.d / b.heads.max(1)
    );
    s.push_str(&header(&[
        "path",
        "n",
        "forward",
        "backward",
        "backward / forward",
        "CPU-time ratio",
    ]));
    let flop = |n: usize| 2.0 * (n * n * 2 * b.d) as f64;
    for x in &b.rows {
        s.push_str(&row(&[
            format!("GPU {}", x.family),
            x.n.to_string(),
            format!(
                "{} ms, {} GFLOP/s",
                sig(x.forward.median_ms),
                sig(x.forward_gflops)
            ),
            format!(
                "{} ms, {} GFLOP/s",
                sig(x.backward.median_ms),
                sig(x.backward_gflops)
            ),
            times(x.backward_over_forward),
            x.cpu_backward_over_forward.map_or("-".into(), times),
        ]));
    }
    for t in &b.pytorch {
        let Some(bwd) = t.backward_ms else { continue };
        s.push_str(&row(&[
            t.label("SDPA"),
            t.n.to_string(),
            format!(
                "{} ms, {} GFLOP/s",
                sig(t.forward_ms),
                sig(flop(t.n) / (t.forward_ms * 1e6))
            ),
            format!(
                "{} ms, {} GFLOP/s",
                sig(bwd),
                sig(2.5 * flop(t.n) / (bwd * 1e6))
            ),
            times(bwd / t.forward_ms),
            "-".into(),
        ]));
    }
    if b.pytorch.is_empty() {
        let _ = writeln!(
            s,
            "\nPyTorch: {}.",
            r.pytorch.note.clone().unwrap_or_else(|| "no rows".into())
        );
    }
    for line in &b.skipped {
        let _ = writeln!(s, "\nSkipped: {line}");
    }
    if !b.not_timed.is_empty() {
        let _ = writeln!(s, "\nNot timed: {}.", b.not_timed.join("; "));
    }
    s.push('\n');
}

fn decode_md(s: &mut String, r: &Report) {
    let d = &r.decode;
    let _ = writeln!(s, "## Decode\n");
    let _ = writeln!(
        s,
        "One new token per sequence per step with a growing KV cache: {} heads (= K/V heads), \
         d = {}, {} K and V; the cache length grows by one per step up to S. GPU KV-cache \
         decode: append the token's K and V to the device's `KvCache`, `Decoder::step` its \
         query, read the output back; whole-call `sdpa`: the same step as one call over the \
         prefix (Q, K, V uploaded each time); CPU: a one-thread f32 decode (`decode::cpu`). \
         ms per step, tokens/s = batch / step time; the ratios are the other path's time over \
         the GPU decode's.\n",
        d.heads, d.d, d.dtype
    );
    s.push_str(&header(&[
        "batch",
        "cache S",
        "GPU KV-cache decode",
        "whole-call `sdpa`",
        "CPU f32, one thread",
        "decode vs whole-call",
        "decode vs CPU",
    ]));
    let mut points: Vec<(usize, usize)> = d.rows.iter().map(|x| (x.batch, x.cache_len)).collect();
    points.dedup();
    for (batch, len) in points {
        let find = |p: &str| {
            d.rows
                .iter()
                .find(|x| x.batch == batch && x.cache_len == len && x.path == p)
        };
        let (Some(gpu), whole, cpu) = (
            find("gpu kv-cache decode"),
            find("gpu whole-call sdpa"),
            find("cpu f32 one thread"),
        ) else {
            continue;
        };
        let ms = |x: Option<&crate::bench_decode::Row>| {
            x.map_or("-".into(), |x| format!("{} ms", sig(x.stats.median_ms)))
        };
        s.push_str(&row(&[
            batch.to_string(),
            len.to_string(),
            format!(
                "{} ms, {} tok/s",
                sig(gpu.stats.median_ms),
                thousands(gpu.tokens_per_s)
            ),
            ms(whole),
            ms(cpu),
            gpu.vs_whole.map_or("-".into(), times),
            gpu.vs_cpu.map_or("-".into(), times),
        ]));
    }
    s.push('\n');
}

fn matmul_md(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## Matmul\n");
    let _ = writeln!(
        s,
        "Square f32 matmuls (m × m by m × m), operands already on the device, the variant the \
         tuner picks in each kernel family (the subgroup family's time includes packing B); \
         GFLOP/s counts 2·m³; the share of the FMA ceiling uses the matmul kernel's own \
         time.\n"
    );
    s.push_str(&header(&[
        "variant",
        "m",
        "ms",
        "GFLOP/s",
        "kernel's share of the FMA ceiling",
        "kernels (ms)",
    ]));
    for x in &r.matmul.rows {
        s.push_str(&row(&[
            format!("`{}`", x.path),
            x.n.to_string(),
            sig(x.stats.median_ms),
            sig(x.gflops),
            x.share_of_fma_peak
                .map_or("-".into(), |p| format!("{:.0} %", 100.0 * p)),
            crate::bench_backward::kernels(&x.kernels_ms),
        ]));
    }
    not_timed_md(s, &r.matmul.not_timed, r.max_call_ms);
    s.push('\n');
}

/// A line naming the families a section left out at larger sizes, if any.
fn not_timed_md(s: &mut String, not_timed: &[String], max_ms: f64) {
    if !not_timed.is_empty() {
        let _ = writeln!(
            s,
            "\nNot timed (`--max-call-ms {}`): {}.",
            sig(max_ms),
            not_timed.join("; ")
        );
    }
}

fn first_call_md(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## First call\n");
    let _ = writeln!(
        s,
        "Each row a fresh process (this binary, started by the report): `Context::new` \
         (adapter and device), then the call twice; the first call's pipeline creation (compile), tuning \
         and device time (dispatch; on lavapipe the kernels' LLVM compile happens at their \
         first dispatch) from `Context::phase_times`. Caches as found: the tuning, pipeline \
         and Mesa shader caches as this machine had them; cold: all three pointed at an empty \
         directory.\n"
    );
    s.push_str(&header(&[
        "caches",
        "call",
        "`Context::new`",
        "first call",
        "its compile, tune, dispatch (pipelines)",
        "second call",
    ]));
    for f in &r.first_call {
        let c = &f.call;
        s.push_str(&row(&[
            f.caches.clone(),
            c.call.clone(),
            format!("{} ms", sig(f.context_new_ms)),
            format!("{} ms", sig(c.first_ms)),
            format!(
                "{}, {}, {} ms ({})",
                sig(c.compile_ms),
                sig(c.tune_ms),
                sig(c.dispatch_ms),
                c.pipelines
            ),
            format!("{} ms", sig(c.second_ms)),
        ]));
    }
    s.push('\n');
}

/// `1 min 05 s` or `12.3 s`.
pub(super) fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{} min {:02} s", (s / 60.0) as u64, s as u64 % 60)
    }
}

/// A number with about three significant figures (`0.0891`, `5.68`, `47.3`, `1028`).
pub(super) fn sig(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

/// A ratio as `2.07×`.
fn times(v: f64) -> String {
    format!("{}×", sig(v))
}

/// Thousands separated by commas: `1,414`.
fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A Markdown table row.
fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

/// A Markdown table's header row and the rule under it.
fn header(cells: &[&str]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| (*c).to_string()).collect();
    row(&cells) + &row(&vec!["---".to_string(); cells.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(sig(0.0891), "0.0891");
        assert_eq!(sig(5.678), "5.68");
        assert_eq!(sig(47.31), "47.3");
        assert_eq!(sig(1028.4), "1028");
        assert_eq!(sig(0.0), "0");
        assert_eq!(thousands(1414.2), "1,414");
        assert_eq!(thousands(250.0), "250");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(
            column_name("gpu subgroup +weights"),
            "GPU subgroup, + weights"
        );
        assert_eq!(column_name("gpu storage fused"), "GPU storage, fused");
    }
}
