//! naga-backends: each WGSL file through naga 30's front end and its Metal and HLSL back ends,
//! with the options wgpu-hal 30 gives them, on a machine with neither a Metal nor a D3D12
//! compiler. What it catches: a kernel that validates (and runs on Vulkan) but that wgpu
//! would refuse to translate for a Mac or a Windows GPU.
//!
//! ```text
//! naga-backends [--jobs N] PATH...
//! ```
//!
//! PATH: `.wgsl` files, or directories searched for them. Every file is parsed and validated
//! (f16, subgroups, and cooperative matrices where the file enables them), then written as
//! MSL 3.1 (all), MSL 2.2 and HLSL SM 6.6 (all but the cooperative-matrix files: Metal's
//! `simdgroup_matrix` needs MSL 2.3, and D3D12 has no cooperative matrices, which wgpu never
//! offers there). A file whose first five lines say `runtime checks: off` is written unchecked,
//! as `create_shader_module_trusted` builds it. `NAGA_BACKENDS_TIMES=1` prints each phase's
//! time. Exit status: 0 all pass, 1 a file fails, 2 a usage error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use naga::back::{hlsl, msl};
use naga::valid::{Capabilities, ModuleInfo, ShaderStages, SubgroupOperationSet, ValidationFlags};

/// The marker of a kernel built without runtime checks (the crate's trusted kernels).
const UNCHECKED_MARKER: &str = "runtime checks: off";

/// A back end and version, and whether it takes the cooperative-matrix files.
#[derive(Clone, Copy)]
enum Target {
    Msl(u8, u8),
    Hlsl(hlsl::ShaderModel),
}

impl Target {
    /// Every target, in the order reported.
    const ALL: [Target; 3] = [
        Target::Msl(2, 2),
        Target::Msl(3, 1),
        Target::Hlsl(hlsl::ShaderModel::V6_6),
    ];

    fn name(self) -> String {
        match self {
            Target::Msl(major, minor) => format!("MSL {major}.{minor}"),
            Target::Hlsl(sm) => format!("HLSL SM {}", sm.to_str().replace('_', ".")),
        }
    }

    /// Why the target does not take a cooperative-matrix file, or `None` if it does.
    fn coop_skip(self) -> Option<&'static str> {
        match self {
            Target::Msl(major, minor) if (major, minor) < (2, 3) => {
                Some("cooperative matrices (simdgroup_matrix) need MSL 2.3")
            }
            Target::Msl(..) => None,
            Target::Hlsl(_) => Some("D3D12 has no cooperative matrices; wgpu never offers them"),
        }
    }
}

/// What one file came to.
struct Outcome {
    path: PathBuf,
    coop: bool,
    /// `None`: parsed and validated; `Some`: why not.
    front: Option<String>,
    /// Per [`Target::ALL`]: `None` passed or skipped, `Some` the error.
    back: Vec<Option<String>>,
    seconds: f64,
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let mut jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut paths = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--jobs" => {
                jobs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage("--jobs needs a positive number"));
            }
            "-h" | "--help" => {
                println!("usage: naga-backends [--jobs N] PATH...");
                return;
            }
            _ if a.starts_with("--") => usage(&format!("unknown option {a}")),
            _ => paths.push(PathBuf::from(a)),
        }
    }
    if paths.is_empty() {
        usage("no PATH given");
    }
    let mut files = Vec::new();
    for p in &paths {
        collect(p, &mut files).unwrap_or_else(|e| usage(&format!("{}: {e}", p.display())));
    }
    files.sort();
    if files.is_empty() {
        usage("no .wgsl file under the given paths");
    }

    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(Vec::with_capacity(files.len()));
    std::thread::scope(|s| {
        for _ in 0..jobs.min(files.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = files.get(i) else { break };
                let outcome = check(path);
                outcomes.lock().unwrap().push(outcome);
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by(|a, b| a.path.cmp(&b.path));
    std::process::exit(report(&outcomes, start.elapsed().as_secs_f64()));
}

fn usage(msg: &str) -> ! {
    eprintln!("naga-backends: {msg}\nusage: naga-backends [--jobs N] PATH...");
    std::process::exit(2);
}

/// The `.wgsl` files at or under `path`.
fn collect(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if !path.is_dir() {
        std::fs::metadata(path)?;
        out.push(path.to_path_buf());
        return Ok(());
    }
    for entry in std::fs::read_dir(path)? {
        let p = entry?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "wgsl") {
            out.push(p);
        }
    }
    Ok(())
}

/// Prints the failures and the counts; returns the exit status.
fn report(outcomes: &[Outcome], seconds: f64) -> i32 {
    let mut failed_files = 0;
    for o in outcomes {
        let errors: Vec<String> = std::iter::once(o.front.clone().map(|e| ("naga front end", e)))
            .flatten()
            .map(|(t, e)| format!("{t}: {e}"))
            .chain(
                Target::ALL
                    .iter()
                    .zip(&o.back)
                    .filter_map(|(t, e)| Some(format!("{}: {}", t.name(), e.as_ref()?))),
            )
            .collect();
        if !errors.is_empty() {
            failed_files += 1;
            println!("FAIL {}", o.path.display());
            for e in errors {
                let first: String = e.lines().take(6).collect::<Vec<_>>().join("\n      ");
                println!("    {first}");
            }
        }
    }
    let coop = outcomes.iter().filter(|o| o.coop).count();
    let front_ok = outcomes.iter().filter(|o| o.front.is_none()).count();
    println!(
        "naga: {} files checked ({coop} with cooperative matrices), {front_ok} parsed and validated",
        outcomes.len()
    );
    for (i, t) in Target::ALL.iter().enumerate() {
        let takes = |o: &&Outcome| o.front.is_none() && (!o.coop || t.coop_skip().is_none());
        let tried = outcomes.iter().filter(takes).count();
        let passed = outcomes
            .iter()
            .filter(takes)
            .filter(|o| o.back[i].is_none())
            .count();
        let skipped = match t.coop_skip() {
            Some(why) => format!(", {coop} skipped ({why})"),
            None => String::new(),
        };
        println!(
            "  {:<12} {passed} of {tried} translated, {} failed{skipped}",
            t.name(),
            tried - passed
        );
    }
    let slowest = outcomes
        .iter()
        .max_by(|a, b| a.seconds.total_cmp(&b.seconds));
    if let Some(s) = slowest {
        println!(
            "naga: {failed_files} file(s) failed; {seconds:.1} s in all (slowest {:.1} s: {})",
            s.seconds,
            s.path.display()
        );
    }
    i32::from(failed_files > 0)
}

/// Parses, validates and translates one file.
fn check(path: &Path) -> Outcome {
    let start = Instant::now();
    let mut outcome = Outcome {
        path: path.to_path_buf(),
        coop: false,
        front: None,
        back: vec![None; Target::ALL.len()],
        seconds: 0.0,
    };
    let source = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) => {
            outcome.front = Some(e.to_string());
            return outcome;
        }
    };
    outcome.coop = source
        .lines()
        .any(|l| l.trim_start().starts_with("enable") && l.contains("wgpu_cooperative_matrix"));
    let unchecked = source.lines().take(5).any(|l| l.contains(UNCHECKED_MARKER));
    match front(&source, outcome.coop) {
        Err(e) => outcome.front = Some(e),
        Ok((module, info)) => {
            if std::env::var_os("NAGA_BACKENDS_TIMES").is_some() {
                eprintln!(
                    "{}: front {:.2} s",
                    path.display(),
                    start.elapsed().as_secs_f64()
                );
            }
            for (slot, target) in outcome.back.iter_mut().zip(Target::ALL) {
                if outcome.coop && target.coop_skip().is_some() {
                    continue;
                }
                let t = Instant::now();
                *slot = translate(&module, &info, target, unchecked).err();
                if std::env::var_os("NAGA_BACKENDS_TIMES").is_some() {
                    eprintln!("  {} {:.2} s", target.name(), t.elapsed().as_secs_f64());
                }
            }
        }
    }
    outcome.seconds = start.elapsed().as_secs_f64();
    outcome
}

/// naga's front end and validator, with the capabilities a device with f16 and subgroups
/// (and cooperative matrices, for `coop`) gives it.
fn front(source: &str, coop: bool) -> Result<(naga::Module, ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut caps = Capabilities::SHADER_FLOAT16 | Capabilities::SUBGROUP;
    if coop {
        caps |= Capabilities::COOPERATIVE_MATRIX;
    }
    let info = naga::valid::Validator::new(ValidationFlags::all(), caps)
        .subgroup_stages(ShaderStages::COMPUTE)
        .subgroup_operations(SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok((module, info))
}

/// The compute entry point's name.
fn entry(module: &naga::Module) -> Result<String, String> {
    module
        .entry_points
        .iter()
        .find(|e| e.stage == naga::ShaderStage::Compute)
        .map(|e| e.name.clone())
        .ok_or_else(|| "no compute entry point".to_string())
}

/// How a global is bound, in the classes both back ends count registers or slots in.
#[derive(Clone, Copy, PartialEq)]
enum Class {
    Uniform,
    ReadStorage,
    ReadWriteStorage,
    Texture,
    StorageTexture,
    Sampler,
}

/// The module's bound globals, in (group, binding) order, with their class: what wgpu derives
/// the pipeline layout from (`layout: None`, as the crate builds its pipelines).
fn bindings(module: &naga::Module) -> Vec<(naga::ResourceBinding, Class)> {
    let mut v: Vec<_> = module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let rb = g.binding?;
            let class = match (g.space, &module.types[g.ty].inner) {
                (naga::AddressSpace::Uniform, _) => Class::Uniform,
                (naga::AddressSpace::Storage { access }, _) => {
                    if access.contains(naga::StorageAccess::STORE) {
                        Class::ReadWriteStorage
                    } else {
                        Class::ReadStorage
                    }
                }
                (_, naga::TypeInner::Image { class, .. }) => match class {
                    naga::ImageClass::Storage { .. } => Class::StorageTexture,
                    _ => Class::Texture,
                },
                _ => Class::Sampler,
            };
            Some((rb, class))
        })
        .collect();
    v.sort_by_key(|(rb, _)| (rb.group, rb.binding));
    v
}

/// Writes `module` for `target` with the options wgpu-hal 30 gives the back end
/// (`wgpu-hal/src/metal/device.rs`, `dx12/device.rs`): bounds-check policies `Restrict` (or
/// `Unchecked` for a trusted kernel), workgroup memory zeroed, loops bounded; the resources
/// numbered as wgpu-hal numbers a pipeline layout's (Metal: buffer, texture and sampler slots
/// counted apart, then the buffer-sizes slot; D3D12: b, t and u registers counted apart, then
/// the special constants' b register that `num_workgroups` reads).
fn translate(
    module: &naga::Module,
    info: &ModuleInfo,
    target: Target,
    unchecked: bool,
) -> Result<(), String> {
    let ep = entry(module)?;
    let policy = if unchecked {
        naga::proc::BoundsCheckPolicy::Unchecked
    } else {
        naga::proc::BoundsCheckPolicy::Restrict
    };
    let binds = bindings(module);
    match target {
        Target::Msl(major, minor) => {
            let mut resources = msl::EntryPointResources::default();
            let (mut buffers, mut textures, mut samplers) = (0u8, 0u8, 0u8);
            for (rb, class) in &binds {
                let mut t = msl::BindTarget::default();
                match class {
                    Class::Uniform | Class::ReadStorage | Class::ReadWriteStorage => {
                        t.buffer = Some(buffers);
                        t.mutable = *class == Class::ReadWriteStorage;
                        buffers += 1;
                    }
                    Class::Texture | Class::StorageTexture => {
                        t.texture = Some(textures);
                        t.mutable = *class == Class::StorageTexture;
                        textures += 1;
                    }
                    Class::Sampler => {
                        t.sampler = Some(msl::BindSamplerTarget::Resource(samplers));
                        samplers += 1;
                    }
                }
                resources.resources.insert(*rb, t);
            }
            if binds
                .iter()
                .any(|(_, c)| matches!(c, Class::ReadStorage | Class::ReadWriteStorage))
            {
                resources.sizes_buffer = Some(buffers);
            }
            let options = msl::Options {
                lang_version: (major, minor),
                per_entry_point_map: msl::EntryPointResourceMap::from([(ep.clone(), resources)]),
                fake_missing_bindings: false,
                bounds_check_policies: naga::proc::BoundsCheckPolicies {
                    index: policy,
                    buffer: policy,
                    image_load: policy,
                    binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
                },
                zero_initialize_workgroup_memory: true,
                force_loop_bounding: !unchecked,
                ..msl::Options::default()
            };
            let pipeline = msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, ep)),
                ..msl::PipelineOptions::default()
            };
            msl::write_string(module, info, &options, &pipeline)
                .map(drop)
                .map_err(|e| format!("{e:?}"))
        }
        Target::Hlsl(shader_model) => {
            let mut binding_map = hlsl::BindingMap::default();
            let (mut b, mut t, mut u, mut s) = (0u32, 0u32, 0u32, 0u32);
            for (rb, class) in &binds {
                let counter = match class {
                    Class::Uniform => &mut b,
                    Class::ReadStorage | Class::Texture => &mut t,
                    Class::ReadWriteStorage | Class::StorageTexture => &mut u,
                    Class::Sampler => &mut s,
                };
                let target = hlsl::BindTarget {
                    space: if *class == Class::Sampler { 255 } else { 0 },
                    register: *counter,
                    ..hlsl::BindTarget::default()
                };
                *counter += 1;
                binding_map.insert(*rb, target);
            }
            let options = hlsl::Options {
                shader_model,
                binding_map,
                fake_missing_bindings: false,
                special_constants_binding: Some(hlsl::BindTarget {
                    register: b,
                    ..hlsl::BindTarget::default()
                }),
                zero_initialize_workgroup_memory: true,
                restrict_indexing: true,
                force_loop_bounding: true,
                ..hlsl::Options::default()
            };
            let pipeline = hlsl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, ep)),
            };
            let mut out = String::new();
            hlsl::Writer::new(&mut out, &options, &pipeline)
                .write(module, info, None)
                .map(drop)
                .map_err(|e| format!("{e:?}"))
        }
    }
}
