//! A GPU stricter than any GPU: runs one dispatch of a WGSL compute shader on the CPU with a
//! GPU's semantics and reports what a GPU would punish.
//!
//! The shader is parsed and validated by naga (the naga that wgpu uses), then one entry point
//! is interpreted over a whole dispatch:
//! - each subgroup (16, 32 or 64 lanes, the caller's choice) runs its lanes in lockstep with an
//!   active-lane mask through divergent control flow, and the subgroup builtins (`subgroupAdd`,
//!   `subgroupShuffleXor`, `subgroupBroadcast`, ballots, ...) act on the active lanes;
//! - the subgroups of a workgroup run one at a time, in a seeded random order, switching at
//!   barriers and at some of their memory accesses, and the lanes of a subgroup run apart
//!   where that shows without breaking lockstep (divergent branches and the lanes of a store
//!   or atomic in a seeded order): [`Schedule`] says exactly what is and is not modelled.
//!   A racy kernel's result then depends on the seed; every finding names the seed it
//!   happened under, and [`Dispatch::seeds`] runs several;
//! - f16 arithmetic is rounded to half after every operation, f32 is computed in f32.
//!
//! It reports ([`Finding`]): data races on workgroup memory and storage buffers, indices out
//! of bounds (the access then reads zero or writes nothing; nothing is clamped), reads of
//! workgroup memory the workgroup never wrote, barriers not every invocation reaches,
//! subgroup operations reading an inactive lane, and (as warnings) NaN or infinity made from
//! finite operands. Anything the interpreter cannot run is an [`Error::Unsupported`] naming
//! it, never skipped.
//!
//! ```
//! use wgsl_sanitizer::{Dispatch, Resource, Shader};
//! let shader = Shader::parse(
//!     "@group(0) @binding(0) var<storage, read_write> out: array<u32>;
//!      @compute @workgroup_size(64)
//!      fn main(@builtin(global_invocation_id) g: vec3<u32>) { out[g.x] = g.x * 2u; }",
//! )
//! .unwrap();
//! let mut dispatch = Dispatch::new("main", [2, 1, 1]);
//! dispatch.bind(0, 0, Resource::Buffer(vec![0; 4 * 128]));
//! let report = shader.run(&mut dispatch).unwrap();
//! assert!(report.findings.is_empty());
//! let out = dispatch.buffer(0, 0).unwrap();
//! assert_eq!(u32::from_le_bytes(out[4 * 5..4 * 6].try_into().unwrap()), 10);
//! ```

mod counters;
mod findings;
mod interp;
mod math;
mod prepare;
mod types;

use std::collections::BTreeMap;
use std::fmt;

pub use counters::{Counters, Sample, Traffic, BANKS, SECTOR_BYTES};
pub use findings::{Finding, FindingKind, Invocation, Severity};

/// Why a shader could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The WGSL did not parse.
    #[error("WGSL parse error: {0}")]
    Parse(String),
    /// naga's validator rejected the module.
    #[error("naga validation error: {0}")]
    Validation(String),
    /// The shader uses something this interpreter does not implement (named).
    #[error("unsupported by the sanitizer: {0}")]
    Unsupported(String),
    /// The dispatch does not fit the shader (a missing binding, a wrong entry point, ...).
    #[error("bad dispatch: {0}")]
    Dispatch(String),
}

/// A texel format of a texture the caller binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TexelFormat {
    /// Four f32 per texel (16 bytes).
    Rgba32Float,
    /// Four f16 per texel (8 bytes).
    Rgba16Float,
    /// One f32 per texel.
    R32Float,
}

impl TexelFormat {
    /// Bytes per texel.
    pub fn bytes(self) -> usize {
        match self {
            TexelFormat::Rgba32Float => 16,
            TexelFormat::Rgba16Float => 8,
            TexelFormat::R32Float => 4,
        }
    }
}

/// A 2D texture of one mip level: `width × height` texels, row-major, tightly packed.
#[derive(Clone, Debug)]
pub struct Texture {
    pub width: u32,
    pub height: u32,
    pub format: TexelFormat,
    pub data: Vec<u8>,
}

/// What is bound at one `(group, binding)`.
#[derive(Clone, Debug)]
pub enum Resource {
    /// A storage or uniform buffer's bytes (little-endian, as the GPU sees them).
    Buffer(Vec<u8>),
    /// A sampled or storage texture.
    Texture(Texture),
}

/// One dispatch of one entry point: what to run, over which workgroups, with what bound.
/// After [`Shader::run`] the bound resources hold what the dispatch wrote.
#[derive(Clone, Debug)]
pub struct Dispatch {
    /// The `@compute` entry point's name.
    pub entry_point: String,
    /// Workgroups in x, y, z.
    pub workgroups: [u32; 3],
    /// Lanes per subgroup: 16, 32 or 64 (default 32).
    pub subgroup_size: u32,
    /// Values of pipeline-overridable constants, by name (or by `@id` as a decimal string).
    pub overrides: BTreeMap<String, f64>,
    /// Seed of the schedule: the order in which the subgroups of a workgroup run and switch
    /// between barriers, and the order of lanes apart ([`Schedule`]). The same seed gives the
    /// same run; a finding names the seed it happened under.
    pub seed: u64,
    /// How many seeds [`Shader::run`] tries: `seed`, `seed + 1`, ... until one of them has an
    /// error (its findings and results are what the run returns), else the last one's.
    /// Default 1.
    pub seeds: u32,
    /// How subgroups and lanes are interleaved between barriers ([`Schedule::default`]).
    pub schedule: Schedule,
    /// The bound resources, by `(group, binding)`.
    pub resources: BTreeMap<(u32, u32), Resource>,
    /// Report NaN and infinity made from finite operands (warnings). Default on.
    pub check_non_finite: bool,
    /// Stop after this many lane-operations (a runaway loop), with an error. Default 2^40.
    pub max_lane_ops: u64,
    /// Workgroup memory starts at zero, as WGSL specifies and wgpu's pipelines do by default
    /// (`zero_initialize_workgroup_memory`): a read of an element this workgroup never wrote
    /// is still a finding, but reads zero, so what follows is what such a pipeline computes.
    /// Default off: it reads garbage, as on a GPU that does not zero it.
    pub zero_workgroup_memory: bool,
    /// Count what the dispatch would spend on a GPU ([`Report::counters`]: FLOPs, global
    /// sectors, bank conflicts, barriers, instructions). Default off (then nothing is
    /// gathered).
    pub counters: bool,
    /// Which workgroups run ([`Sample::All`] by default): a sample of a large dispatch is
    /// counted and scaled to the whole; the other workgroups do not run (their results are
    /// not written).
    pub sample: Sample,
}

/// How the sanitizer interleaves what a GPU may run in any order between two barriers
/// (adversarially, so that a result that depends on the order differs between seeds).
///
/// Modelled:
/// - the subgroups of a workgroup run one at a time, the next one drawn at random from those
///   that can run, whenever the running one reaches a barrier, ends, or switches;
/// - a subgroup switches, besides, at `switches_per_interval` of its memory instructions on
///   workgroup memory or a writable storage buffer or texture (a load, store or atomic,
///   cooperative loads and stores included) per barrier interval, at points drawn across the
///   interval (its length estimated from the subgroup's previous interval): another subgroup
///   then runs before that instruction, so a read-modify-write that is not atomic can lose an
///   update, and a value read twice can change in between;
/// - with `lanes_apart`, the lanes of a subgroup run apart where that is observable without
///   breaking lockstep: the two sides of a divergent `if` (so also the lanes that leave a
///   loop by a `break` under an `if` and those that stay) and the cases of a divergent
///   `switch` run in a seeded order, and the lanes of one store or atomic (a `textureStore`
///   included) make their accesses in a seeded order (a random rotation of the active lanes,
///   reversed or not), so which lane's store survives on one address, and the values an atomic
///   hands out, vary.
///
/// Not modelled: lanes of a subgroup interleaved inside one instruction or statement (a
/// subgroup's instruction is performed by all its active lanes before anything else runs),
/// lanes running ahead past the end of a construct (they reconverge at the end of each `if`,
/// `switch` and loop, so a subgroup operation always sees every lane that reaches it), a
/// load's lanes in another order (it changes no value), memory orderings weaker than
/// sequential consistency between barriers, and workgroups running at the same time (they run
/// one after another; races across workgroups are still found by the race checker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Extra switches a subgroup makes per barrier interval at its memory instructions (0:
    /// subgroups switch only at barriers). Each costs a thread hand-over, so the cost is
    /// bounded by this times the number of subgroups and intervals, whatever a kernel's number
    /// of accesses. Default 2.
    pub switches_per_interval: u32,
    /// The lanes of a subgroup apart (divergent branches and the lanes of a store or atomic in
    /// a seeded order). Default on.
    pub lanes_apart: bool,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            switches_per_interval: 2,
            lanes_apart: true,
        }
    }
}

impl Schedule {
    /// The schedule before adversarial scheduling: subgroups switch only at barriers, lanes in
    /// lockstep in a fixed order (the `else` side after the `if` side, lanes lowest first).
    pub fn at_barriers_only() -> Schedule {
        Schedule {
            switches_per_interval: 0,
            lanes_apart: false,
        }
    }
}

impl Dispatch {
    /// A dispatch of `entry_point` over `workgroups`, 32 lanes per subgroup, seed 0 (one
    /// seed), the default [`Schedule`], nothing bound.
    pub fn new(entry_point: &str, workgroups: [u32; 3]) -> Dispatch {
        Dispatch {
            entry_point: entry_point.to_string(),
            workgroups,
            subgroup_size: 32,
            overrides: BTreeMap::new(),
            seed: 0,
            seeds: 1,
            schedule: Schedule::default(),
            resources: BTreeMap::new(),
            check_non_finite: true,
            max_lane_ops: 1 << 40,
            zero_workgroup_memory: false,
            counters: false,
            sample: Sample::All,
        }
    }

    /// Binds `resource` at `(group, binding)`.
    pub fn bind(&mut self, group: u32, binding: u32, resource: Resource) -> &mut Self {
        self.resources.insert((group, binding), resource);
        self
    }

    /// The bytes of the buffer bound at `(group, binding)`.
    pub fn buffer(&self, group: u32, binding: u32) -> Option<&[u8]> {
        match self.resources.get(&(group, binding)) {
            Some(Resource::Buffer(b)) => Some(b),
            _ => None,
        }
    }

    /// The texture bound at `(group, binding)`.
    pub fn texture(&self, group: u32, binding: u32) -> Option<&Texture> {
        match self.resources.get(&(group, binding)) {
            Some(Resource::Texture(t)) => Some(t),
            _ => None,
        }
    }
}

/// What one dispatch found, and how much it ran.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Each distinct finding once (kind and place), with how often it happened.
    pub findings: Vec<Finding>,
    /// Lane-operations interpreted: expressions and statements times the lanes active for
    /// them (all seeds run together).
    pub lane_ops: u64,
    /// The most loop iterations (all loops together) one invocation ran (under any seed).
    pub max_loop_iterations: u64,
    /// The seed of the run reported (whose results the dispatch holds): the first of
    /// [`Dispatch::seeds`] seeds with an error, else the last one run.
    pub seed: u64,
    /// How many seeds were run (the findings are the reported seed's).
    pub seeds_run: u32,
    /// What the dispatch would spend on a GPU, when [`Dispatch::counters`] is on (the
    /// reported seed's run; estimated from the sampled workgroups under [`Dispatch::sample`]).
    pub counters: Option<Counters>,
    /// Under [`Sample::Chosen`] with counters on: each chosen workgroup's own counts,
    /// unweighted, by linear index (how its cost depends on where it sits in the grid).
    pub workgroup_counters: Vec<(u64, Counters)>,
}

impl Report {
    /// The findings that are errors (not warnings).
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for finding in &self.findings {
            writeln!(f, "{finding}")?;
        }
        Ok(())
    }
}

/// A parsed and validated WGSL module, ready to run.
pub struct Shader {
    pub(crate) module: naga::Module,
    pub(crate) info: naga::valid::ModuleInfo,
    pub(crate) source: String,
    pub(crate) types: types::TypeTable,
}

impl Shader {
    /// Parses and validates `source` (every naga capability allowed: f16, subgroups,
    /// cooperative matrices).
    ///
    /// # Errors
    /// [`Error::Parse`] or [`Error::Validation`] with naga's message.
    pub fn parse(source: &str) -> Result<Shader, Error> {
        let module = naga::front::wgsl::parse_str(source)
            .map_err(|e| Error::Parse(e.emit_to_string(source)))?;
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .subgroup_stages(naga::valid::ShaderStages::all())
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| Error::Validation(e.emit_to_string(source)))?;
        let types = types::TypeTable::new(&module.types);
        Ok(Shader {
            module,
            info,
            source: source.to_string(),
            types,
        })
    }

    /// Bytes of workgroup memory the module declares (all `var<workgroup>` together, as
    /// naga lays them out): what a workgroup holds on the GPU (occupancy).
    pub fn workgroup_memory_bytes(&self) -> u64 {
        let ctx = self.module.to_ctx();
        self.module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| u64::from(self.module.types[g.ty].inner.size(ctx)))
            .sum()
    }

    /// The names of the module's compute entry points.
    pub fn entry_points(&self) -> Vec<String> {
        self.module
            .entry_points
            .iter()
            .filter(|e| e.stage == naga::ShaderStage::Compute)
            .map(|e| e.name.clone())
            .collect()
    }

    /// Checks without running that everything `entry_point` can reach is supported.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first thing that is not (with its line), or
    /// [`Error::Dispatch`] when there is no such compute entry point.
    pub fn check_supported(&self, entry_point: &str) -> Result<(), Error> {
        let ep = self.entry_point(entry_point)?;
        prepare::check_supported(self, ep)
    }

    /// Runs one dispatch; the resources in `dispatch` then hold what it wrote. With
    /// [`Dispatch::seeds`] above 1 it runs again from the same resources under the next seeds
    /// until one has an error, and returns that run ([`Report::seed`] says which).
    ///
    /// # Errors
    /// [`Error::Dispatch`] when the dispatch does not fit the shader, [`Error::Unsupported`]
    /// when the shader uses something not implemented.
    pub fn run(&self, dispatch: &mut Dispatch) -> Result<Report, Error> {
        let ep = self.entry_point(&dispatch.entry_point)?;
        prepare::check_supported(self, ep)?;
        let seeds = dispatch.seeds.max(1);
        let before = (seeds > 1).then(|| dispatch.resources.clone());
        let (mut lane_ops, mut iterations) = (0, 0);
        for i in 0..seeds {
            let seed = dispatch.seed.wrapping_add(i as u64);
            if i > 0 {
                let before = before.as_ref().expect("kept");
                dispatch.resources.clone_from(before);
            }
            let mut report = interp::run(self, ep, dispatch, seed)?;
            lane_ops += report.lane_ops;
            iterations = iterations.max(report.max_loop_iterations);
            if i + 1 == seeds || report.errors().next().is_some() {
                report.seeds_run = i + 1;
                report.lane_ops = lane_ops;
                report.max_loop_iterations = iterations;
                return Ok(report);
            }
        }
        unreachable!("at least one seed runs")
    }

    pub(crate) fn entry_point(&self, name: &str) -> Result<usize, Error> {
        self.module
            .entry_points
            .iter()
            .position(|e| e.name == name && e.stage == naga::ShaderStage::Compute)
            .ok_or_else(|| Error::Dispatch(format!("no compute entry point named `{name}`")))
    }

    /// `line:column` of a byte offset in the source.
    pub(crate) fn location(&self, span: naga::Span) -> Option<(u32, u32)> {
        if span.is_defined() && (span.to_range()?.start) <= self.source.len() {
            let l = span.location(&self.source);
            Some((l.line_number, l.line_position))
        } else {
            None
        }
    }
}

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
