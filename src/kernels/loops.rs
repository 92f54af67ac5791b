//! Loop iterations per invocation, and lavapipe's cap on them.
//!
//! Mesa's llvmpipe compiler (gallivm, the code generator of lavapipe, our default adapter
//! where there is no GPU) counts the loop iterations of each shader invocation over all its
//! loops together, and past `LP_MAX_TGSI_LOOP_ITERATIONS` (65,535) every loop runs its body
//! once more and exits: the writes that depend on later iterations never happen and nothing
//! reports it. `flash_tiled` over 60,000 keys gave a relative error of 1.02 that way, and the
//! emulated cooperative matrices failed under the stand-in for the same reason
//! (docs/testing.md, "lavapipe's loop cap").
//!
//! So every kernel states an upper bound on the loop iterations of its busiest invocation
//! ([`crate::kernels::Kernel::loops`]) from its constants and uniform, and [`check`] refuses
//! a dispatch past the device's cap ([`crate::gpu::Gpu`]'s `loop_cap`: 65,535 on llvmpipe,
//! none elsewhere) with [`Error::LimitExceeded`] of [`Limit::LoopIterations`], before anything is
//! recorded. The planner keeps calls under it where it can (the fused pass splits its keys
//! into ranges, `flash_blocked` with a key split), so a long call there is right or refused,
//! never silently wrong.
//!
//! The bound counts every iteration of every loop as the WGSL is written after the host's
//! unrolling, each loop's trips plus one for the test that ends it ([`run`]; a `// unroll`
//! loop counts nothing where the build unrolls it, as a loop where it stays one: the
//! stand-in's emulated builds). The shader compiler may unroll
//! more (NIR unrolls short constant loops), which only lowers the true count: the bound is
//! never below it. `tests/loop_cap.rs` runs the kernels on both sides of their bound.

use crate::error::{Error, Limit, Result};
use crate::gpu::hardware::Emulation;

/// How a kernel's build runs its loops: what its count needs beyond its constants and uniform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Build {
    /// Its `// unroll` loops are unrolled (not in the stand-in's emulated builds).
    pub unrolled: bool,
    /// What is emulated.
    pub emulate: Emulation,
}

impl Build {
    /// The build of a device emulating `emulate`.
    pub fn of(emulate: Emulation) -> Self {
        Build {
            unrolled: emulate.subgroup == 0,
            emulate,
        }
    }

    /// The iterations of a `// unroll` loop of `trips` trips: none where it is unrolled,
    /// else as [`run`].
    pub fn marked(&self, trips: u64) -> u64 {
        if self.unrolled {
            0
        } else {
            run(trips)
        }
    }
}

/// The iterations a loop of `trips` trips counts: one more, the test that ends it (measured:
/// `flash_tiled` with 32-key tiles at d 64 counts 85 per tile, its five loops' 80 trips and
/// five ends, and fails past 24,672 keys exactly as that predicts).
pub(crate) fn run(trips: u64) -> u64 {
    trips + 1
}

/// The trips of `for (var t = first; t < end; t += step)` for the invocation that makes the
/// most (`first` = 0): `⌈end / step⌉`.
pub(crate) fn strided(end: u64, step: u64) -> u64 {
    end.div_ceil(step.max(1))
}

/// `Err` when `iterations` pass `cap` (see the [module docs](self)).
///
/// # Errors
/// [`Error::LimitExceeded`] naming `label`, the count and the cap.
pub(crate) fn check(label: &str, iterations: u64, cap: Option<u64>) -> Result<()> {
    match cap {
        Some(cap) if iterations > cap => Err(Error::LimitExceeded {
            what: format!("one invocation of {label}"),
            needed: format!("{iterations} loop iterations"),
            limit: format!("{cap}"),
            limit_name: Limit::LoopIterations,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hardware::LLVMPIPE_LOOP_CAP;

    #[test]
    fn a_count_past_the_cap_is_an_error_that_names_it() {
        assert!(check("k", LLVMPIPE_LOOP_CAP, Some(LLVMPIPE_LOOP_CAP)).is_ok());
        assert!(check("k", u64::MAX, None).is_ok());
        let err = check("flash_tiled", 70_000, Some(LLVMPIPE_LOOP_CAP)).unwrap_err();
        let text = err.to_string();
        for want in ["flash_tiled", "70000 loop iterations", "65535", "llvmpipe"] {
            assert!(text.contains(want), "{text}");
        }
    }

    #[test]
    fn strided_loops_and_marked_loops() {
        assert_eq!(strided(0, 64), 0);
        assert_eq!(strided(65, 64), 2);
        let rolled = Build::of(Emulation {
            subgroup: 32,
            coop: 0,
        });
        assert_eq!(rolled.marked(8), 9);
        assert_eq!(run(0), 1);
        assert_eq!(Build::of(Emulation::default()).marked(8), 0);
    }
}
