//! Recording a dispatch: the kernel's pipeline (made once per key), its bind groups and its
//! grid, after the checks no wgpu validation makes in a word one can act on (the bindings,
//! the modifiers' storage buffers, lavapipe's loop cap); or, while [`collect_keys`] runs, only
//! the pipeline keys a call would need.

use super::*;

/// Records one dispatch of kernel `K` into `encoder`: built with `consts` and element types
/// `f16`, `params` at binding 0, `resources` at bindings 1, 2, … (as [`Kernel::BINDINGS`]
/// lists them), over `workgroups` workgroups.
///
/// # Errors
/// [`Error::LimitExceeded`] when the grid cannot hold `workgroups`; an internal
/// [`Error::InvalidArgument`] when `resources` do not match the kernel's bindings.
pub(crate) fn record<K: Kernel>(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    consts: &K::Consts,
    f16: u8,
    params: &K::Params,
    resources: &[Binding<'_>],
    workgroups: u64,
) -> Result<()> {
    record_with::<K>(
        ctx,
        encoder,
        (consts, f16),
        params,
        resources,
        None,
        workgroups,
    )
}

/// [`record`] of a kernel that calls the modifiers' functions: built with `mods`' code (or
/// the identity stubs without), its buffers (and block map) bound at group 1.
///
/// # Errors
/// As [`record`].
pub(crate) fn record_with<K: Kernel>(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    (consts, f16): (&K::Consts, u8),
    params: &K::Params,
    resources: &[Binding<'_>],
    mods: Option<mods::ModsBind<'_>>,
    workgroups: u64,
) -> Result<()> {
    let mut key = PipelineKey::of::<K>(consts, f16);
    key.mods = mods.map_or(0, |m| m.upload.code_id);
    key.emulate = ctx.hardware().emulate;
    // Per dispatch: the label alone, not the whole description.
    let label = K::ID.file();
    if resources.len() != K::BINDINGS.len() {
        return Err(Error::invalid(
            label,
            format!(
                "internal: {} resources bound, the kernel declares {}",
                resources.len(),
                K::BINDINGS.len()
            ),
        ));
    }
    if let Some(m) = &mods {
        // A caller's buffers take a storage binding each: say so before wgpu's validation
        // does, in a word no one can act on.
        let storage = K::storage_bindings() + m.upload.buffers.len() + usize::from(m.map.is_some());
        let limit = ctx.limits().max_storage_buffers_per_shader_stage as usize;
        if storage > limit {
            return Err(Error::LimitExceeded {
                what: format!(
                    "{label} with the modifiers' {} buffer(s) (the presets share one)",
                    m.upload.buffers.len()
                ),
                needed: format!("{storage} storage buffers"),
                limit: format!("{limit} per shader stage"),
                limit_name: Limit::MaxStorageBuffersPerShaderStage,
            });
        }
    }
    let loop_bound = K::loops(consts, params, loops::Build::of(key.emulate));
    loops::check(label, loop_bound, ctx.hardware().loop_cap)?;
    if K::SUBGROUPS {
        ctx.require_subgroups()?;
    }
    if K::COOP {
        ctx.require_coop()?;
    }
    let (x, y) = grid(
        workgroups,
        ctx.limits().max_compute_workgroups_per_dimension,
    )?;
    if x == 0 {
        return Ok(());
    }
    if COLLECTING.with(|c| c.borrow_mut().as_mut().map(|keys| keys.push(key)).is_some()) {
        return Ok(());
    }
    if capturing() {
        let captured = captured::<K>((&key, consts), params, resources, mods, [x, y, 1]);
        CAPTURING.with(|c| c.borrow_mut().as_mut().map(|v| v.push(captured)));
        return Ok(());
    }
    if ctx.sanitized_lanes().is_some() {
        let params = bytemuck::bytes_of(params);
        return sanitized::<K>(
            ctx,
            encoder,
            (&key, consts),
            params,
            resources,
            mods,
            ([x, y, 1], loop_bound),
        );
    }
    log::debug!("{label} {consts:?}: {workgroups} workgroups as {x}x{y}");
    let pipeline = ctx.pipelines.get(ctx, &key)?;
    let uniform = crate::gpu::buffer::uniform(ctx, label, params)?;
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: uniform.as_entire_binding(),
    }];
    entries.extend(
        resources
            .iter()
            .enumerate()
            .map(|(i, r)| wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: match *r {
                    Binding::Buffer(b) => b.as_entire_binding(),
                    Binding::Texture(t) => wgpu::BindingResource::TextureView(t),
                },
            }),
    );
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let mods_group = mods.map(|m| {
        let entries = m.entries();
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("modifier buffers"),
            layout: &pipeline.get_bind_group_layout(1),
            entries: &entries,
        })
    });
    timing::pass(ctx, encoder, label, |pass| {
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        if let Some(g) = &mods_group {
            pass.set_bind_group(1, g, &[]);
        }
        pass.dispatch_workgroups(x, y, 1);
    })
}

/// [`record_with`] under the WGSL sanitizer (`crate::gpu::sanitizer`): the dispatch runs in
/// the interpreter now, on the native kernel text, over the device's buffers as they are;
/// its first error found is this dispatch's error, naming the kernel, its variant, the line
/// (of the composed kernel, and of `shaders/` where the line is found there) and both
/// invocations; warnings are logged. An invocation that runs more loop iterations than
/// `loop_bound` (the kernel's stated bound, [`Kernel::loops`]) is an error too: lavapipe's
/// loop-cap guard (`loops::check`) trusts that bound.
///
/// # Errors
/// [`Error::Sanitizer`] for a finding, or a kernel the interpreter cannot run; GPU errors.
#[cfg(not(target_arch = "wasm32"))]
fn sanitized<K: Kernel>(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    (key, consts): (&PipelineKey, &K::Consts),
    params: &[u8],
    resources: &[Binding<'_>],
    mods: Option<mods::ModsBind<'_>>,
    (workgroups, loop_bound): ([u32; 3], u64),
) -> Result<()> {
    use crate::gpu::pipeline::PipelineRecipe;
    use crate::gpu::sanitizer::{Bound, BoundAs, Job};
    let label = K::ID.file();
    let mut bound = vec![Bound {
        group: 0,
        binding: 0,
        what: BoundAs::Bytes(params),
    }];
    for (i, (r, slot)) in resources.iter().zip(K::BINDINGS).enumerate() {
        let writable = matches!(slot, Slot::ReadWrite(_) | Slot::StorageTexture(_));
        bound.push(Bound {
            group: 0,
            binding: i as u32 + 1,
            what: match *r {
                Binding::Buffer(b) => BoundAs::Buffer(b, writable),
                Binding::Texture(t) => BoundAs::Texture(t, writable),
            },
        });
    }
    let group1 = mods.as_ref().map(|m| m.buffers()).unwrap_or_default();
    for (i, b) in group1.into_iter().enumerate() {
        bound.push(Bound {
            group: 1,
            binding: i as u32,
            what: BoundAs::Buffer(b, false),
        });
    }
    let source = || key.source();
    let job = Job {
        label,
        hash: key.pipeline_hash().0,
        wgsl: &source,
        entry: K::ENTRY,
        workgroups,
        bound: &bound,
        loop_bound,
    };
    let report = ctx.sanitize(encoder, &job)?;
    let over_bound = report.max_loop_iterations > loop_bound;
    if report.findings.is_empty() && !over_bound {
        return Ok(());
    }
    let lanes = ctx.sanitized_lanes().unwrap_or(0);
    let mut variant = format!(
        "{label} {consts:?}, f16 mask {:#b}, {lanes}-lane subgroups",
        key.f16
    );
    if key.mods != 0 {
        variant.push_str(&format!(", modifiers {:#x}", key.mods));
    }
    let text = ctx.sanitizer_text(label, key.source());
    let kept = dump(label, key, &text);
    let own = K::ID.info().source;
    let described: Vec<(bool, String)> = report
        .findings
        .iter()
        .map(|f| {
            let error = f.severity == wgsl_sanitizer::Severity::Error;
            (error, describe(f, &text, (label, own)))
        })
        .collect();
    for ((error, d), f) in described.iter().zip(&report.findings) {
        match error {
            true => log::error!("WGSL sanitizer, {variant}: {d}"),
            false => {
                let once = format!("{label} {:#b} {:?} {:?}", key.f16, f.kind, f.location);
                if ctx.first_warning(once) {
                    log::warn!("WGSL sanitizer, {variant}: {d} (logged once)");
                }
            }
        }
    }
    let loops = over_bound.then(|| {
        let d = format!(
            "one invocation ran {} loop iterations, more than the {loop_bound} its \
             `Kernel::loops` states: the bound is wrong, so the guard against lavapipe's \
             loop cap (src/kernels/loops.rs) is unsafe",
            report.max_loop_iterations,
        );
        log::error!("WGSL sanitizer, {variant}: {d}");
        d
    });
    let mut errors = described
        .into_iter()
        .filter(|(e, _)| *e)
        .map(|(_, d)| d)
        .chain(loops);
    let Some(first) = errors.next() else {
        return Ok(());
    };
    let others = errors.count();
    let mut message = first;
    if others > 0 {
        message.push_str(&format!(
            " (and {others} more findings in this dispatch, logged)"
        ));
    }
    if let Some(path) = kept {
        message.push_str(&format!("; the kernel's text: {}", path.display()));
    }
    message.push_str(&format!(
        "; WGPU_ATTENTION_SANITIZE_SEED={} reproduces it",
        report.seed
    ));
    Err(Error::Sanitizer {
        kernel: variant,
        message,
    })
}

/// Under the browser there is no sanitizer (the interpreter runs a workgroup's subgroups
/// on threads).
#[cfg(target_arch = "wasm32")]
fn sanitized<K: Kernel>(
    _: &Gpu,
    _: &mut wgpu::CommandEncoder,
    _: (&PipelineKey, &K::Consts),
    _: &[u8],
    _: &[Binding<'_>],
    _: Option<mods::ModsBind<'_>>,
    _: ([u32; 3], u64),
) -> Result<()> {
    Err(Error::Sanitizer {
        kernel: K::ID.file().to_string(),
        message: "the WGSL sanitizer runs natively only".into(),
    })
}

/// A finding in one line, each WGSL place with its text and, where that line is found once
/// in the kernel's own file, its line there (`shaders/<file>:LINE`).
#[cfg(not(target_arch = "wasm32"))]
fn describe(f: &wgsl_sanitizer::Finding, text: &str, (label, own): (&str, &str)) -> String {
    let place = |at: Option<(u32, u32)>| -> String {
        let Some((line, column)) = at else {
            return String::new();
        };
        let code = text
            .lines()
            .nth(line.saturating_sub(1) as usize)
            .unwrap_or("")
            .trim();
        let mut found = own.lines().enumerate().filter(|(_, l)| l.trim() == code);
        let in_file = match (found.next(), found.next()) {
            (Some((i, _)), None) if !code.is_empty() => format!(", shaders/{label}:{}", i + 1),
            _ => String::new(),
        };
        format!(" [line {line}:{column}{in_file}: `{code}`]")
    };
    format!(
        "{f}{}{}",
        place(f.location),
        match f.other_location {
            Some(_) => format!(" other side{}", place(f.other_location)),
            None => String::new(),
        }
    )
}

/// Writes the kernel's composed text where a finding can be read against it again:
/// `$TMPDIR/wgpu-attention-sanitizer/<kernel>-<hash>.wgsl` (`None` when it cannot be).
#[cfg(not(target_arch = "wasm32"))]
fn dump(label: &str, key: &PipelineKey, text: &str) -> Option<std::path::PathBuf> {
    use crate::gpu::pipeline::PipelineRecipe;
    let dir = std::env::temp_dir().join("wgpu-attention-sanitizer");
    std::fs::create_dir_all(&dir).ok()?;
    let name = format!(
        "{}-{:08x}.wgsl",
        label.trim_end_matches(".wgsl"),
        key.pipeline_hash().0 as u32
    );
    let path = dir.join(name);
    std::fs::write(&path, text).ok()?;
    Some(path)
}

std::thread_local! {
    /// While [`collect_keys`] runs on this thread: the pipeline keys [`record`] was asked
    /// for, instead of recording.
    static COLLECTING: std::cell::RefCell<Option<Vec<PipelineKey>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with [`record`] only noting which pipelines it would use (nothing is recorded
/// and no pipeline is made), and returns their keys: what a call will need, so that
/// [`crate::gpu::pipeline::PipelineCache::prepare`] can compile them side by side first.
///
/// # Errors
/// `f`'s error.
pub(crate) fn collect_keys(f: impl FnOnce() -> Result<()>) -> Result<Vec<PipelineKey>> {
    /// Puts the outer state back however `f` ends (a panic caught upstream included), so
    /// the thread never stays in collecting mode, where `record` records nothing.
    struct Restore(Option<Option<Vec<PipelineKey>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                COLLECTING.with(|c| *c.borrow_mut() = outer);
            }
        }
    }
    let mut restore = Restore(Some(
        COLLECTING.with(|c| c.borrow_mut().replace(Vec::new())),
    ));
    let result = f();
    let keys = COLLECTING.with(|c| c.borrow_mut().take());
    if let Some(outer) = restore.0.take() {
        COLLECTING.with(|c| *c.borrow_mut() = outer);
    }
    result.map(|()| keys.unwrap_or_default())
}

/// Whether [`collect_keys`] is running on this thread (nothing is recorded).
pub(crate) fn collecting() -> bool {
    COLLECTING.with(|c| c.borrow().is_some())
}

/// One dispatch as [`capture`] noted it instead of recording it: what the WGSL sanitizer
/// needs to run it again on buffers of the same sizes (the profile module).
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    /// The kernel file.
    pub label: &'static str,
    /// Its variant (the constants it was built with, and the f16 mask).
    pub variant: String,
    /// The kernel's full WGSL text.
    pub source: String,
    pub entry: &'static str,
    pub workgroups: [u32; 3],
    /// The parameters' bytes (group 0, binding 0).
    pub params: Vec<u8>,
    /// Every buffer bound (a texture: 0 bytes).
    pub buffers: Vec<CapturedBuffer>,
    /// What the host wrote into some of them before the call, by buffer id, where it is
    /// known: a block map made on the host and its uniform (the rest start as zeros).
    pub written: Vec<(u64, Vec<u8>)>,
}

/// One buffer of a [`Captured`] dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CapturedBuffer {
    pub group: u32,
    pub binding: u32,
    pub bytes: u64,
    /// The buffer's identity (its hash): the same buffer in two dispatches of a call has
    /// the same, so what one writes the next can read.
    pub id: u64,
    /// A texture's width, height and format (`bytes` is 0 then).
    pub texture: Option<(u32, u32, wgpu::TextureFormat)>,
}

fn buffer_id(b: &wgpu::Buffer) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

fn captured<K: Kernel>(
    (key, consts): (&PipelineKey, &K::Consts),
    params: &K::Params,
    resources: &[Binding<'_>],
    mods: Option<mods::ModsBind<'_>>,
    workgroups: [u32; 3],
) -> Captured {
    let buffer = |group: u32, binding: u32, b: &wgpu::Buffer| CapturedBuffer {
        group,
        binding,
        bytes: b.size(),
        id: buffer_id(b),
        texture: None,
    };
    let mut buffers: Vec<CapturedBuffer> = resources
        .iter()
        .enumerate()
        .map(|(i, r)| match *r {
            Binding::Buffer(b) => buffer(0, i as u32 + 1, b),
            Binding::Texture(view) => {
                let t = view.texture();
                CapturedBuffer {
                    group: 0,
                    binding: i as u32 + 1,
                    bytes: 0,
                    id: 0,
                    texture: Some((t.width(), t.height(), t.format())),
                }
            }
        })
        .collect();
    let group1 = mods.as_ref().map(|m| m.buffers()).unwrap_or_default();
    let written = mods
        .as_ref()
        .and_then(|m| m.map)
        .map(|map| {
            map.host_written()
                .into_iter()
                .map(|(b, bytes)| (buffer_id(b), bytes))
                .collect()
        })
        .unwrap_or_default();
    buffers.extend(
        group1
            .into_iter()
            .enumerate()
            .map(|(i, b)| buffer(1, i as u32, b)),
    );
    Captured {
        label: K::ID.file(),
        variant: format!("{consts:?}, f16 mask {:#b}", key.f16),
        source: key.source(),
        entry: K::ENTRY,
        workgroups,
        params: bytemuck::bytes_of(params).to_vec(),
        buffers,
        written,
    }
}

std::thread_local! {
    /// While [`capture`] runs on this thread: the dispatches [`record`] was asked for.
    static CAPTURING: std::cell::RefCell<Option<Vec<Captured>>> =
        const { std::cell::RefCell::new(None) };
}

fn capturing() -> bool {
    CAPTURING.with(|c| c.borrow().is_some())
}

/// Runs `f` with [`record`] noting each dispatch ([`Captured`]) instead of recording it
/// (nothing runs on the device; what the call reads back is whatever its buffers held), and
/// returns them in order.
///
/// # Errors
/// `f`'s error.
pub(crate) fn capture(f: impl FnOnce() -> Result<()>) -> Result<Vec<Captured>> {
    /// Leaves capturing mode however `f` ends.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            CAPTURING.with(|c| *c.borrow_mut() = None);
        }
    }
    CAPTURING.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let restore = Restore;
    let result = f();
    let captured = CAPTURING
        .with(|c| c.borrow_mut().take())
        .unwrap_or_default();
    drop(restore);
    result.map(|()| captured)
}
