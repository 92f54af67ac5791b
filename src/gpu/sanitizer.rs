//! The WGSL sanitizer as the device (`WGPU_ATTENTION_SANITIZE=32|64|16`,
//! [`crate::Context::with_sanitizer`], `verify --sanitize`): every dispatch is run by the
//! `wgsl-sanitizer` crate's interpreter instead of the adapter, with a GPU's semantics
//! (subgroups of the chosen width in lockstep, the subgroups of a workgroup interleaved at
//! barriers, f16 rounded per operation) and its checks (races, out-of-bounds accesses,
//! uninitialised workgroup memory, divergent barriers, inactive-lane reads).
//!
//! The call is planned as a discrete GPU of that subgroup width plans it (see
//! [`super::hardware`]) and its kernels are the native text such a GPU gets: real subgroup
//! builtins and 16 × 16 cooperative matrices, nothing emulated. The adapter (lavapipe in CI)
//! still holds every buffer and does every copy: before a dispatch what was recorded so far
//! is submitted, the bound buffers and textures are read back, the interpreter runs the whole
//! dispatch on those bytes, and what it wrote goes back into the device's buffers (only the
//! bytes that changed), so the call's answer is the sanitizer's. No pipeline is compiled.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::Gpu;
use crate::error::{Error, Result};

/// Whether dispatches run under the WGSL sanitizer, and at which subgroup width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sanitize {
    /// Dispatches run on the adapter.
    #[default]
    Off,
    /// Every dispatch runs under the sanitizer with subgroups of this many lanes (16, 32 or
    /// 64: Intel's, NVIDIA's, AMD's wave64), the call planned as such a GPU plans it.
    Lanes(u32),
}

impl Sanitize {
    /// The subgroup width (`None`: off).
    pub fn lanes(self) -> Option<u32> {
        match self {
            Sanitize::Off => None,
            Sanitize::Lanes(n) => Some(n),
        }
    }

    /// `WGPU_ATTENTION_SANITIZE`: `32`, `64`, `16` (or `on`: 32), or `off` / `0` / empty /
    /// unset.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable for any other value.
    pub fn from_env() -> Result<Self> {
        match std::env::var("WGPU_ATTENTION_SANITIZE") {
            Err(_) => Ok(Sanitize::Off),
            Ok(v) => v.parse(),
        }
    }
}

impl std::str::FromStr for Sanitize {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "16" => Ok(Sanitize::Lanes(16)),
            "32" | "on" => Ok(Sanitize::Lanes(32)),
            "64" => Ok(Sanitize::Lanes(64)),
            "" | "off" | "0" | "none" => Ok(Sanitize::Off),
            other => Err(Error::invalid(
                "WGPU_ATTENTION_SANITIZE",
                format!("{other:?} is not a subgroup width: use 32, 64, 16 or off"),
            )),
        }
    }
}

impl fmt::Display for Sanitize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sanitize::Off => f.write_str("off"),
            Sanitize::Lanes(n) => write!(f, "{n}"),
        }
    }
}

/// The first seed of the schedule (the subgroups' order, where they give up their turn, the
/// order of divergent arms and of one instruction's lanes): `WGPU_ATTENTION_SANITIZE_SEED`,
/// else 0.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn seed() -> u64 {
    std::env::var("WGPU_ATTENTION_SANITIZE_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Seeds run per dispatch, from [`seed`] on (each from the same inputs; the first with an
/// error is the one reported): `WGPU_ATTENTION_SANITIZE_SEEDS`, else 1.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn seeds_from_env() -> u32 {
    std::env::var("WGPU_ATTENTION_SANITIZE_SEEDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(1)
}

mod summary;

#[cfg(not(target_arch = "wasm32"))]
use summary::Noted;
use summary::PROCESS;
pub use summary::{LoopPeak, SanitizerSummary};

/// A device's sanitizer state: the parsed kernels (by pipeline hash) and the tally.
#[derive(Default)]
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) struct Sanitizer {
    shaders: Mutex<HashMap<u128, Arc<wgsl_sanitizer::Shader>>>,
    tally: Mutex<SanitizerSummary>,
    /// The warnings logged so far (each is logged once).
    logged: Mutex<std::collections::HashSet<String>>,
    /// A test's rewriting of the kernels' text (see [`crate::Context::with_sanitizer_edit`]).
    pub(crate) edit: Option<KernelEdit>,
    /// Seeds per dispatch (see [`crate::Context::with_sanitizer_seeds`]; `None`: the
    /// environment's).
    pub(crate) seeds: Option<u32>,
}

/// A rewriting of a kernel's text under the sanitizer: given the kernel file's name and its
/// composed text, the text to run instead (`None`: as it is).
pub type KernelEdit = fn(&str, &str) -> Option<String>;

/// One resource of a dispatch, at `(group, binding)`.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) struct Bound<'a> {
    pub group: u32,
    pub binding: u32,
    pub what: BoundAs<'a>,
}

/// What is bound.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) enum BoundAs<'a> {
    /// A uniform block's bytes (the kernel's parameters: never read back).
    Bytes(&'a [u8]),
    /// A buffer on the device, and whether the kernel may write it.
    Buffer(&'a wgpu::Buffer, bool),
    /// A texture on the device (its view), and whether the kernel may write it.
    Texture(&'a wgpu::TextureView, bool),
}

/// One dispatch to interpret.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) struct Job<'a> {
    /// The kernel file (the tally's name).
    pub label: &'static str,
    /// The pipeline's hash (the parsed kernel is kept under it).
    pub hash: u128,
    /// The kernel's full WGSL text, made only when it is not parsed yet.
    pub wgsl: &'a dyn Fn() -> String,
    pub entry: &'a str,
    pub workgroups: [u32; 3],
    pub bound: &'a [Bound<'a>],
    /// The loop iterations per invocation the kernel states for this dispatch
    /// (`Kernel::loops`): an invocation that runs more is an error of the dispatch.
    pub loop_bound: u64,
}

impl Gpu {
    /// The subgroup width dispatches run under the sanitizer at, if they do.
    pub(crate) fn sanitized_lanes(&self) -> Option<u32> {
        self.hardware().sanitize
    }

    /// Whether the warning `key` is new on this device (so logged now): a warning of every
    /// dispatch of a kernel would bury everything else.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn first_warning(&self, key: String) -> bool {
        self.sanitizer
            .logged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key)
    }

    /// The text the sanitizer runs for kernel `label` composed as `text`: `text`, or a
    /// test's rewriting of it.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn sanitizer_text(&self, label: &str, text: String) -> String {
        match self.sanitizer.edit.and_then(|edit| edit(label, &text)) {
            Some(edited) => edited,
            None => text,
        }
    }

    /// Applies `f` to this device's tally and to the process's.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    fn tallies(&self, f: impl Fn(&mut SanitizerSummary)) {
        for tally in [&self.sanitizer.tally, &PROCESS] {
            f(&mut tally.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// What ran under the sanitizer so far and what it found.
    pub(crate) fn sanitizer_summary(&self) -> SanitizerSummary {
        let mut s = self
            .sanitizer
            .tally
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.lanes = self.sanitized_lanes().unwrap_or(0);
        s
    }
}

/// Natively only: the browser's device maps nothing synchronously, and the interpreter runs
/// the subgroups of a workgroup on threads of their own.
#[cfg(not(target_arch = "wasm32"))]
impl Gpu {
    /// Runs `job` under the sanitizer (see the module docs): what `encoder` holds is submitted
    /// first (a fresh encoder takes its place), the bound resources are read back, the
    /// interpreter runs, and what the kernel wrote is written back. Returns the report; the
    /// caller turns its findings, and loop iterations past `job.loop_bound`, into errors (the
    /// tally counts both).
    ///
    /// # Errors
    /// [`Error::Sanitizer`] when the interpreter cannot run the kernel; GPU errors.
    pub(crate) fn sanitize(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        job: &Job<'_>,
    ) -> Result<wgsl_sanitizer::Report> {
        let lanes = self.sanitized_lanes().unwrap_or(32);
        let began = std::time::Instant::now();
        let shader = self.sanitized_shader(job)?;
        let fresh = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("after a sanitized dispatch"),
            });
        let before = std::mem::replace(encoder, fresh);
        self.queue.submit([before.finish()]);
        let read = self.read_bound(job.bound)?;
        let mut dispatch = wgsl_sanitizer::Dispatch::new(job.entry, job.workgroups);
        dispatch.subgroup_size = lanes;
        dispatch.seed = seed();
        dispatch.seeds = self.sanitizer.seeds.unwrap_or_else(seeds_from_env);
        // The crate's pipelines zero workgroup memory (wgpu's default, as WGSL says): a read
        // of an element never written is still a finding, and reads zero, as there.
        dispatch.zero_workgroup_memory = true;
        for (b, resource) in job.bound.iter().zip(&read) {
            dispatch.bind(b.group, b.binding, resource.clone());
        }
        let start = std::time::Instant::now();
        let ran = shader.run(&mut dispatch);
        let elapsed = start.elapsed();
        let ran = ran.map_err(|e| Error::Sanitizer {
            kernel: job.label.to_string(),
            message: format!("could not run it: {e}"),
        });
        let noted = Noted {
            label: job.label,
            lanes,
            report: ran.as_ref().ok(),
            loop_bound: job.loop_bound,
            time: elapsed,
        };
        self.tallies(|t| t.note(&noted));
        let report = ran?;
        self.write_back(job.bound, &read, &dispatch)?;
        let overhead = began.elapsed().saturating_sub(elapsed);
        self.tallies(|t| t.overhead += overhead);
        Ok(report)
    }

    /// The parsed kernel of `job`, parsed once per pipeline.
    fn sanitized_shader(&self, job: &Job<'_>) -> Result<Arc<wgsl_sanitizer::Shader>> {
        let mut shaders = self
            .sanitizer
            .shaders
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(s) = shaders.get(&job.hash) {
            return Ok(s.clone());
        }
        let began = std::time::Instant::now();
        let text = self.sanitizer_text(job.label, (job.wgsl)());
        let shader = wgsl_sanitizer::Shader::parse(&text).map_err(|e| Error::Sanitizer {
            kernel: job.label.to_string(),
            message: format!("could not take the kernel: {e}"),
        })?;
        let shader = Arc::new(shader);
        shaders.insert(job.hash, shader.clone());
        log::debug!(
            "sanitizer: {} parsed ({} lines) in {:.2} s",
            job.label,
            text.lines().count(),
            began.elapsed().as_secs_f64()
        );
        Ok(shader)
    }

    /// The bound resources as the device holds them now (after everything submitted).
    fn read_bound(&self, bound: &[Bound<'_>]) -> Result<Vec<wgsl_sanitizer::Resource>> {
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("sanitizer readback"),
            });
        let mut staged = Vec::with_capacity(bound.len());
        for b in bound {
            staged.push(match b.what {
                BoundAs::Bytes(_) => None,
                BoundAs::Buffer(buf, _) => {
                    if !buf.usage().contains(wgpu::BufferUsages::COPY_SRC) {
                        return Err(Error::Sanitizer {
                            kernel: format!("binding ({}, {})", b.group, b.binding),
                            message: "internal: a buffer made without COPY_SRC cannot be \
                                      read for the sanitizer"
                                .into(),
                        });
                    }
                    let bytes = buf.size() & !3;
                    let staging = self.staging(bytes);
                    if bytes > 0 {
                        encoder.copy_buffer_to_buffer(buf, 0, &staging, 0, bytes);
                    }
                    Some(staging)
                }
                BoundAs::Texture(view, _) => {
                    let texture = view.texture();
                    let (width, height, texel) = texture_layout(texture)?;
                    let row = (width * texel).next_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT);
                    let staging = self.staging(u64::from(row) * u64::from(height));
                    encoder.copy_texture_to_buffer(
                        texture.as_image_copy(),
                        wgpu::TexelCopyBufferInfo {
                            buffer: &staging,
                            layout: wgpu::TexelCopyBufferLayout {
                                offset: 0,
                                bytes_per_row: Some(row),
                                rows_per_image: Some(height),
                            },
                        },
                        texture.size(),
                    );
                    Some(staging)
                }
            });
        }
        let submission = self.queue.submit([encoder.finish()]);
        let mapped = staged
            .iter()
            .flatten()
            .map(super::readback::map_read)
            .collect::<Vec<_>>();
        super::readback::wait(self, submission)?;
        super::readback::mapped(self, mapped)?;
        let mut out = Vec::with_capacity(bound.len());
        for (b, s) in bound.iter().zip(&staged) {
            out.push(match (&b.what, s) {
                (BoundAs::Bytes(bytes), _) => wgsl_sanitizer::Resource::Buffer(bytes.to_vec()),
                (BoundAs::Buffer(buf, _), Some(s)) => {
                    let mut bytes = s.slice(..).get_mapped_range().map_err(readback)?.to_vec();
                    bytes.resize(buf.size() as usize, 0);
                    wgsl_sanitizer::Resource::Buffer(bytes)
                }
                (BoundAs::Texture(view, _), Some(s)) => {
                    let texture = view.texture();
                    let (width, height, texel) = texture_layout(texture)?;
                    let row = (width * texel).next_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT);
                    let padded = s.slice(..).get_mapped_range().map_err(readback)?;
                    let mut data = Vec::with_capacity((width * texel * height) as usize);
                    for r in 0..height as usize {
                        let at = r * row as usize;
                        data.extend_from_slice(&padded[at..at + (width * texel) as usize]);
                    }
                    wgsl_sanitizer::Resource::Texture(wgsl_sanitizer::Texture {
                        width,
                        height,
                        format: texel_format(texture.format())?,
                        data,
                    })
                }
                _ => unreachable!("every buffer and texture is staged"),
            });
        }
        Ok(out)
    }

    /// A mappable buffer of at least `bytes` (never empty).
    fn staging(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("sanitizer staging"),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Writes into the device what the dispatch changed in its writable resources: for a
    /// buffer the span from the first to the last changed word, for a texture the whole.
    fn write_back(
        &self,
        bound: &[Bound<'_>],
        before: &[wgsl_sanitizer::Resource],
        after: &wgsl_sanitizer::Dispatch,
    ) -> Result<()> {
        for (b, old) in bound.iter().zip(before) {
            match (&b.what, old) {
                (BoundAs::Buffer(buf, true), wgsl_sanitizer::Resource::Buffer(old)) => {
                    let new = after.buffer(b.group, b.binding).unwrap_or(old);
                    let len = (buf.size() as usize & !3).min(new.len());
                    let changed = |w: &usize| old[4 * w..4 * w + 4] != new[4 * w..4 * w + 4];
                    let words = len / 4;
                    let Some(first) = (0..words).find(changed) else {
                        continue;
                    };
                    let last = (0..words).rev().find(changed).unwrap_or(first);
                    if !buf.usage().contains(wgpu::BufferUsages::COPY_DST) {
                        return Err(Error::Sanitizer {
                            kernel: format!("binding ({}, {})", b.group, b.binding),
                            message: "internal: the kernel wrote a buffer made without \
                                      COPY_DST, so its results cannot go back to the device"
                                .into(),
                        });
                    }
                    self.queue
                        .write_buffer(buf, 4 * first as u64, &new[4 * first..4 * last + 4]);
                }
                (BoundAs::Texture(view, true), wgsl_sanitizer::Resource::Texture(old)) => {
                    let Some(new) = after.texture(b.group, b.binding) else {
                        continue;
                    };
                    if new.data == old.data {
                        continue;
                    }
                    let texture = view.texture();
                    let (width, height, texel) = texture_layout(texture)?;
                    self.queue.write_texture(
                        texture.as_image_copy(),
                        &new.data,
                        wgpu::TexelCopyBufferLayout {
                            offset: 0,
                            bytes_per_row: Some(width * texel),
                            rows_per_image: Some(height),
                        },
                        texture.size(),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn readback(e: impl fmt::Display) -> Error {
    Error::Readback(format!("under the sanitizer: {e}"))
}

#[cfg(not(target_arch = "wasm32"))]
/// A texture's width, height and bytes per texel, as the sanitizer takes it (2D, one level).
fn texture_layout(texture: &wgpu::Texture) -> Result<(u32, u32, u32)> {
    let size = texture.size();
    let texel = texel_format(texture.format())?.bytes() as u32;
    if size.depth_or_array_layers != 1 || texture.mip_level_count() != 1 {
        return Err(Error::Sanitizer {
            kernel: texture_label(texture),
            message: "only 2D textures of one level are supported".into(),
        });
    }
    Ok((size.width, size.height, texel))
}

#[cfg(not(target_arch = "wasm32"))]
fn texture_label(texture: &wgpu::Texture) -> String {
    format!("a {:?} texture", texture.format())
}

/// The sanitizer's texel format of a wgpu texture format (the profile's, on every target).
pub(crate) fn texel_format(format: wgpu::TextureFormat) -> Result<wgsl_sanitizer::TexelFormat> {
    use wgsl_sanitizer::TexelFormat as T;
    match format {
        wgpu::TextureFormat::Rgba32Float => Ok(T::Rgba32Float),
        wgpu::TextureFormat::Rgba16Float => Ok(T::Rgba16Float),
        wgpu::TextureFormat::R32Float => Ok(T::R32Float),
        other => Err(Error::Sanitizer {
            kernel: format!("a {other:?} texture"),
            message: "the sanitizer takes rgba32float, rgba16float and r32float textures".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::summary::{grouped, LoopPeak};
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_switch_takes_widths_and_off() {
        for (text, want) in [
            ("32", Sanitize::Lanes(32)),
            ("on", Sanitize::Lanes(32)),
            (" 64 ", Sanitize::Lanes(64)),
            ("16", Sanitize::Lanes(16)),
            ("off", Sanitize::Off),
            ("", Sanitize::Off),
        ] {
            assert_eq!(text.parse::<Sanitize>().unwrap(), want, "{text:?}");
        }
        let e = "8".parse::<Sanitize>().unwrap_err().to_string();
        assert!(
            e.contains("WGPU_ATTENTION_SANITIZE") && e.contains("32, 64, 16"),
            "{e}"
        );
    }

    #[test]
    fn the_summary_is_one_line_naming_kernels_and_findings() {
        let mut s = SanitizerSummary {
            lanes: 32,
            lane_ops: 2_000_000,
            time: Duration::from_secs(1),
            ..Default::default()
        };
        s.dispatches.insert("matmul.wgsl", 3);
        s.loops = LoopPeak {
            iterations: 1234,
            bound: 2000,
            kernel: "matmul.wgsl",
        };
        let line = s.to_string();
        assert!(line.contains("found nothing;"), "{line}");
        assert!(
            line.ends_with(
                "loop iterations per invocation at most 1,234 (matmul, stated bound 2,000; \
                 lavapipe's cap 65,535)"
            ),
            "{line}"
        );
        s.errors.insert("matmul.wgsl", 1);
        s.over_bound.insert("matmul.wgsl", 1);
        let line = s.to_string();
        assert!(
            line.contains("matmul x3") && line.contains("found 1 errors (matmul x1)"),
            "{line}"
        );
        assert!(
            line.ends_with("past the stated bound in 1 dispatches (matmul x1)"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000_000), "1,000,000");
    }
}
