//! shader-stats: how AMD's compiler sees a WGSL compute kernel, on a machine with no GPU.
//!
//! Each file goes to SPIR-V through naga with the options wgpu 30 uses on Vulkan (with its
//! runtime checks, or without them as `create_shader_module_trusted` with
//! `ShaderRuntimeChecks::unchecked()`), then to Mesa's RADV driver started as a null device
//! of an AMD GPU family (`RADV_FORCE_FAMILY`, compute in wave32), which compiles the compute
//! pipeline and reports its statistics: registers, spills, scratch, LDS, occupancy.
//!
//! RADV reads its environment when it loads and prints on stderr, so the work happens in a
//! second process of this same binary (the driver process, `driver.rs`), started with that
//! environment on all the files at once; this process (`run.rs`) reads what it reports and
//! prints it. A compiler crash costs one file: a new driver process goes on with the rest.

mod cli;
mod driver;
mod run;
mod wgsl;
mod wire;

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == driver::ARG) {
        args.remove(0);
        return driver::main(args);
    }
    match cli::parse(args) {
        Ok(cli::Parsed::Help) => {
            println!("{}", cli::USAGE);
            ExitCode::SUCCESS
        }
        Ok(cli::Parsed::Run(opts)) => run::run(&opts).code(),
        Err(message) => {
            eprintln!("shader-stats: {message} (--help shows the usage)");
            ExitCode::from(2)
        }
    }
}
