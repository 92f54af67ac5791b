//! What the sanitizer reports: one [`Finding`] per kind and place, with the invocations
//! involved and how often it happened.

use std::collections::HashMap;
use std::fmt;

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FindingKind {
    /// Two invocations of a workgroup accessed one element of workgroup memory in the same
    /// barrier interval, at least one of them writing (neither atomically).
    WorkgroupRace,
    /// Two invocations of a dispatch accessed one element of a storage buffer (or texel of a
    /// storage texture) without a barrier between them, at least one of them writing.
    StorageRace,
    /// An index past the end of an array, vector, buffer or texture.
    OutOfBounds,
    /// A read of workgroup memory that no invocation of this workgroup had written.
    UninitializedRead,
    /// A barrier that not every live invocation of the workgroup reached, or that the
    /// subgroups reached at different barrier statements.
    DivergentBarrier,
    /// A subgroup operation that reads a lane that is inactive (or outside the subgroup).
    InactiveLaneRead,
    /// A floating-point operation whose operands were finite made NaN or an infinity.
    NonFinite,
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FindingKind::WorkgroupRace => "data race on workgroup memory",
            FindingKind::StorageRace => "data race on a storage resource",
            FindingKind::OutOfBounds => "index out of bounds",
            FindingKind::UninitializedRead => "read of uninitialised workgroup memory",
            FindingKind::DivergentBarrier => "divergent barrier",
            FindingKind::InactiveLaneRead => "subgroup operation reads an inactive lane",
            FindingKind::NonFinite => "NaN or infinity from finite operands",
        })
    }
}

/// Error or warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One invocation: its workgroup, local id, subgroup and lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Invocation {
    pub workgroup: [u32; 3],
    pub local_id: [u32; 3],
    pub subgroup: u32,
    pub lane: u32,
}

impl fmt::Display for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [wx, wy, wz] = self.workgroup;
        let [lx, ly, lz] = self.local_id;
        write!(
            f,
            "workgroup ({wx},{wy},{wz}) local ({lx},{ly},{lz}) subgroup {} lane {}",
            self.subgroup, self.lane
        )
    }
}

/// One finding: what, where in the WGSL, who, and which element.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// The entry point that ran.
    pub entry_point: String,
    /// `(line, column)` in the WGSL of the access or operation (1-based).
    pub location: Option<(u32, u32)>,
    /// `(line, column)` of the other side (the earlier conflicting access of a race, the
    /// other barrier), where there is one.
    pub other_location: Option<(u32, u32)>,
    /// The invocation that did it.
    pub invocation: Option<Invocation>,
    /// The other invocation of a race (the earlier access), or the lane read of a subgroup
    /// operation.
    pub other: Option<Invocation>,
    /// What was accessed: variable or binding and element, or what diverged.
    pub detail: String,
    /// How many times this finding happened (same kind and place), counting lanes.
    pub count: u64,
    /// The seed of the schedule it happened under ([`crate::Dispatch::seed`]): running the
    /// dispatch again with this seed reproduces it.
    pub seed: u64,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}: {} in `{}`", self.kind, self.entry_point)?;
        if let Some((l, c)) = self.location {
            write!(f, " at {l}:{c}")?;
        }
        write!(f, ": {}", self.detail)?;
        if let Some(i) = &self.invocation {
            write!(f, "; by {i}")?;
        }
        if let Some(o) = &self.other {
            write!(f, "; other: {o}")?;
            if let Some((l, c)) = self.other_location {
                write!(f, " at {l}:{c}")?;
            }
        }
        write!(
            f,
            " ({} times, under seed {}: the same seed reproduces it)",
            self.count, self.seed
        )
    }
}

/// A raw finding as the interpreter sees it: spans and linear invocation ids, turned into
/// a [`Finding`] at the end.
#[derive(Clone, Debug)]
pub(crate) struct Raw {
    pub kind: FindingKind,
    pub span: naga::Span,
    pub other_span: Option<naga::Span>,
    /// Linear invocation id: workgroup linear index × workgroup size + local index.
    pub inv: Option<u32>,
    pub other: Option<u32>,
    pub detail: String,
}

/// Collects findings, keeping the first of each kind and place and counting the rest.
#[derive(Default)]
pub(crate) struct Collector {
    pub list: Vec<(Raw, u64)>,
    index: HashMap<(FindingKind, u32, u32), usize>,
}

impl Collector {
    /// Whether a finding of this kind at this place is already recorded (then only counted).
    pub fn bump(&mut self, kind: FindingKind, span: naga::Span) -> bool {
        let key = (kind, span_start(span), span_end(span));
        if let Some(&i) = self.index.get(&key) {
            self.list[i].1 += 1;
            true
        } else {
            false
        }
    }

    pub fn add(&mut self, raw: Raw) {
        let key = (raw.kind, span_start(raw.span), span_end(raw.span));
        if let Some(&i) = self.index.get(&key) {
            self.list[i].1 += 1;
        } else {
            self.index.insert(key, self.list.len());
            self.list.push((raw, 1));
        }
    }
}

fn span_start(s: naga::Span) -> u32 {
    s.to_range().map(|r| r.start as u32).unwrap_or(u32::MAX)
}

fn span_end(s: naga::Span) -> u32 {
    s.to_range().map(|r| r.end as u32).unwrap_or(u32::MAX)
}
