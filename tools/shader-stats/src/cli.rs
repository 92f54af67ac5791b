//! The command line, parsed by hand (a dozen flags do not need a parser crate).

use std::ffi::OsString;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: shader-stats [OPTIONS] FILE.wgsl...

Compiles each WGSL compute kernel to SPIR-V with naga as wgpu 30 does on Vulkan, builds its
compute pipeline with Mesa's RADV driver started as a null device of an AMD GPU (no hardware
needed; wave32), and prints the compiler's figures: VGPRs, SGPRs, spilled VGPRs and SGPRs,
scratch bytes, LDS bytes, subgroups per SIMD (occupancy) and code size.

options:
  --unchecked            compile every file without runtime checks, as
                         create_shader_module_trusted(.., ShaderRuntimeChecks::unchecked())
  --unchecked-if-marked  compile unchecked the files whose first five lines say
                         `runtime checks: off` (as `wgpu-attention shaders` marks them)
  --entry NAME           the compute entry point (default: the file's only one)
  --family NAME          the chip RADV compiles for, by Mesa's name for it (default gfx1100 =
                         RDNA3; Mesa 22.3 also knows navi21 = RDNA2, aldebaran = MI200...)
  --all                  print every statistic the driver reports, with its description
  --isa                  also print what RADV_DEBUG=shaders dumps (NIR, ACO IR, machine code)
  --check                print one table row per file and fail (exit 1) when a file spills
                         registers, uses scratch memory, runs fewer than --min-subgroups
                         subgroups per SIMD, or does not compile
  --min-subgroups N      the occupancy --check asks for (default 4)
  --exempt PREFIX        with --check: files whose name starts with PREFIX are compiled and
                         printed, but their failures are reported as exempt (repeatable)
  -h, --help             this text

exit status: 0 all well, 1 a --check failed, 2 usage error, or a file does not compile
(without --check), or no RADV driver. Needs mesa-vulkan-drivers.";

/// Which files are compiled without runtime checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// Every file with wgpu's default runtime checks.
    On,
    /// Every file unchecked (`--unchecked`).
    Off,
    /// The files whose header says `runtime checks: off` (`--unchecked-if-marked`).
    Marked,
}

/// What `--check` enforces.
#[derive(Clone, Debug)]
pub struct Rules {
    pub min_subgroups: u64,
    pub exempt: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub files: Vec<PathBuf>,
    pub checks: Checks,
    pub entry: Option<String>,
    pub family: String,
    pub all: bool,
    pub isa: bool,
    /// `Some` with `--check`.
    pub rules: Option<Rules>,
}

pub enum Parsed {
    Help,
    Run(Options),
}

/// Parses the arguments after the program name. `Err` is a one-line message for the user.
pub fn parse(args: Vec<OsString>) -> Result<Parsed, String> {
    let mut files = Vec::new();
    let mut checks = Checks::On;
    let mut entry = None;
    let mut family = "gfx1100".to_string();
    let (mut all, mut isa, mut check) = (false, false, false);
    let mut min_subgroups = None;
    let mut exempt = Vec::new();

    let mut args = args.into_iter();
    let mut only_files = false;
    while let Some(arg) = args.next() {
        let text = arg.to_str();
        if only_files || !text.is_some_and(|t| t.starts_with('-')) {
            files.push(PathBuf::from(arg));
            continue;
        }
        let text = text.unwrap_or_default();
        // `--flag=value` or `--flag value`.
        let (flag, inline) = match text.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (text, None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("{flag} needs {what}")),
            }
        };
        match flag {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--" => only_files = true,
            "--unchecked" => checks = set_checks(checks, Checks::Off)?,
            "--unchecked-if-marked" => checks = set_checks(checks, Checks::Marked)?,
            "--entry" => entry = Some(value("an entry point name")?),
            "--family" => family = value("a GPU family such as gfx1100")?,
            "--all" => all = true,
            "--isa" => isa = true,
            "--check" => check = true,
            "--min-subgroups" => {
                let v = value("a number")?;
                let n = v
                    .parse()
                    .map_err(|_| format!("--min-subgroups: `{v}` is not a whole number"))?;
                min_subgroups = Some(n);
            }
            "--exempt" => exempt.push(value("a file-name prefix")?),
            _ => return Err(format!("unknown option `{text}`")),
        }
        if inline.is_some()
            && !matches!(
                flag,
                "--entry" | "--family" | "--min-subgroups" | "--exempt"
            )
        {
            return Err(format!("{flag} takes no value"));
        }
    }

    if files.is_empty() {
        return Err("no WGSL file given".into());
    }
    if family.is_empty() || !family.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "--family `{family}`: expected a name such as gfx1100"
        ));
    }
    if !check && (min_subgroups.is_some() || !exempt.is_empty()) {
        return Err("--min-subgroups and --exempt go with --check".into());
    }
    if check && (all || isa) {
        return Err("--check prints its own table: leave out --all and --isa".into());
    }
    let rules = check.then(|| Rules {
        min_subgroups: min_subgroups.unwrap_or(4),
        exempt,
    });
    Ok(Parsed::Run(Options {
        files,
        checks,
        entry,
        family,
        all,
        isa,
        rules,
    }))
}

fn set_checks(old: Checks, new: Checks) -> Result<Checks, String> {
    if old != Checks::On && old != new {
        return Err("--unchecked and --unchecked-if-marked exclude each other".into());
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().map(OsString::from).collect())? {
            Parsed::Run(o) => Ok(o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn flags_and_files() {
        let o = parse_strs(&[
            "a.wgsl",
            "--unchecked",
            "--family=navi21",
            "--entry",
            "main",
            "b.wgsl",
        ])
        .unwrap();
        assert_eq!(o.files, [PathBuf::from("a.wgsl"), PathBuf::from("b.wgsl")]);
        assert_eq!(o.checks, Checks::Off);
        assert_eq!(o.family, "navi21");
        assert_eq!(o.entry.as_deref(), Some("main"));
        assert!(o.rules.is_none());
    }

    #[test]
    fn check_rules() {
        let o = parse_strs(&[
            "--check",
            "--exempt",
            "coop-",
            "--min-subgroups",
            "8",
            "x.wgsl",
        ])
        .unwrap();
        let r = o.rules.unwrap();
        assert_eq!((r.min_subgroups, r.exempt), (8, vec!["coop-".to_string()]));
        assert_eq!(
            parse_strs(&["--check", "x.wgsl"])
                .unwrap()
                .rules
                .unwrap()
                .min_subgroups,
            4
        );
    }

    #[test]
    fn mistakes_are_reported() {
        for bad in [
            &["x.wgsl", "--bogus"][..],
            &[],
            &["x.wgsl", "--entry"],
            &["x.wgsl", "--exempt", "a"],
            &["x.wgsl", "--check", "--min-subgroups", "four"],
            &["x.wgsl", "--unchecked", "--unchecked-if-marked"],
            &["x.wgsl", "--family", "gfx 11"],
            &["x.wgsl", "--all=yes"],
        ] {
            assert!(parse_strs(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(parse(vec!["-h".into()]), Ok(Parsed::Help)));
        // After `--` everything is a file.
        assert_eq!(
            parse_strs(&["--", "--check"]).unwrap().files,
            [PathBuf::from("--check")]
        );
    }
}
