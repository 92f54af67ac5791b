//! `wgpu-attention shaders --out DIR`: the fully specialised WGSL of every kernel variant
//! the tuner may pick on a GPU, for offline compiler checks (`.ci/gpu-shader-stats`).

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
    /// Also write the subgroup family's variants, for the default adapter's subgroup size
    /// (they need one; without an adapter only the storage family is written).
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
