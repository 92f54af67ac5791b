//! `wgpu-attention shaders --out DIR`: the fully specialised WGSL of every kernel variant
//! either profile may run (a GPU's tuner's, lavapipe's, the subgroup family's, the GPU
//! stand-in's emulated sources), for offline compiler checks (`.ci/gpu-shader-stats` on the
//! GPU families; Tint and naga's MSL/HLSL back ends on all: `static_gates_ci` in `.ci/run`).

use std::path::PathBuf;

use clap::Args;
use wgpu_attention::{bench, Result};

use crate::AdapterArgs;

/// Arguments of `shaders`.
#[derive(Args)]
pub struct ShadersArgs {
    /// Directory to write `<family>/<variant>.wgsl` into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the subgroup family's variants for the default adapter's subgroup size
    /// (without it they are written at 8, 16, 32 and 64 lanes).
    #[arg(long)]
    pub subgroup: bool,
    #[command(flatten)]
    pub adapter: AdapterArgs,
}

/// Writes the files and lists them.
pub fn shaders_cmd(args: &ShadersArgs) -> Result<bool> {
    let sg = if args.subgroup {
        args.adapter.open()?.subgroup_size()
    } else {
        None
    };
    let files = bench::write_shaders(&args.out, sg)?;
    for f in &files {
        println!("{}", f.display());
    }
    Ok(true)
}
