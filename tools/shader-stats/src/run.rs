//! The main process: starts the driver process on the files, reads its records as they
//! come, and prints each file's figures (or, with `--check`, the table and the verdict).

use crate::cli::{Checks, Options, Rules};
use crate::driver;
use crate::wire::{Compiled, Failure, Record, MARK};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// How the run ended, as the exit status tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every file compiled (and, with `--check`, passed or is exempt).
    Ok,
    /// `--check` found a file that fails.
    CheckFailed,
    /// A file does not compile (without `--check`), or the driver cannot run.
    Error,
}

impl Outcome {
    pub fn code(self) -> ExitCode {
        ExitCode::from(match self {
            Outcome::Ok => 0,
            Outcome::CheckFailed => 1,
            Outcome::Error => 2,
        })
    }
}

/// One file to compile, with runtime checks or not.
struct Job {
    path: PathBuf,
    checked: bool,
}

/// The figures the report shows, by the names RADV gives its statistics.
const FIGURES: [&str; 8] = [
    "VGPRs",
    "SGPRs",
    "Spilled VGPRs",
    "Spilled SGPRs",
    "Scratch size",
    "LDS size",
    "Subgroups per SIMD",
    "Code size",
];

/// The header line a kernel built with `create_shader_module_trusted` carries.
const UNCHECKED_MARK: &str = "runtime checks: off";

pub fn run(opts: &Options) -> Outcome {
    let jobs: Vec<Job> = opts
        .files
        .iter()
        .map(|path| Job {
            path: path.clone(),
            checked: match opts.checks {
                Checks::On => true,
                Checks::Off => false,
                Checks::Marked => !marked_unchecked(path),
            },
        })
        .collect();
    let mut report = Report::new(opts, jobs.len());
    let result = Scratch::new().and_then(|scratch| drive(opts, &jobs, &scratch.0, &mut report));
    match result {
        Ok(()) => report.finish(),
        Err(message) => {
            eprintln!("error: {message}");
            Outcome::Error
        }
    }
}

/// Whether the file's first five lines say `runtime checks: off`. An unreadable file is
/// left to the driver process, which reports it.
fn marked_unchecked(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    BufReader::new(file)
        .lines()
        .take(5)
        .map_while(Result::ok)
        .any(|line| line.contains(UNCHECKED_MARK))
}

/// Runs the driver process over the jobs and hands each result to the report. A driver
/// that dies on a file (the compiler crashed) costs that file only: a new driver process
/// goes on with the next. `Err`: the driver cannot run at all.
fn drive(opts: &Options, jobs: &[Job], scratch: &Path, report: &mut Report) -> Result<(), String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find this program's binary: {e}"))?;
    let mut next = 0;
    while next < jobs.len() {
        let batch = &jobs[next..];
        // The driver's stdout and stderr share one pipe, so its messages and records arrive
        // in the order it wrote them.
        let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
        let writer2 = writer
            .try_clone()
            .map_err(|e| format!("cannot make a pipe: {e}"))?;
        let mut cmd = Command::new(&exe);
        cmd.arg(driver::ARG);
        if let Some(entry) = &opts.entry {
            cmd.arg("--entry").arg(entry);
        }
        cmd.args(batch.iter().map(|j| driver::job_arg(&j.path, j.checked)))
            // RADV without a GPU: a null device of this family, compute in wave32.
            .env("RADV_FORCE_FAMILY", &opts.family)
            .env("RADV_PERFTEST", "cswave32")
            // Nothing written under $HOME, nothing cached.
            .env("MESA_SHADER_CACHE_DISABLE", "true")
            .env("XDG_CACHE_HOME", scratch)
            .env("XDG_RUNTIME_DIR", scratch)
            .stdin(Stdio::null())
            .stdout(writer2)
            .stderr(writer);
        if opts.isa {
            cmd.env("RADV_DEBUG", "shaders");
        } else {
            cmd.env_remove("RADV_DEBUG");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the driver process: {e}"))?;
        // The command holds the pipe's write ends: without them the read sees the end.
        drop(cmd);

        let mut reader = BufReader::new(reader);
        let mut log: Vec<String> = Vec::new();
        let (mut current, mut done) = (None, 0);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("cannot read the driver process's output: {e}"));
                }
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            let record = line.find(MARK).and_then(|at| {
                if at > 0 {
                    log.push(line[..at].to_string());
                }
                Record::decode(&line[at + MARK.len_utf8()..])
            });
            match record {
                None => log.push(line.to_string()),
                Some(Record::Device(name)) => report.device(&name),
                Some(Record::Start(i)) => {
                    // What came before (the driver's start-up chatter) is nobody's log.
                    log.clear();
                    current = Some(i);
                }
                Some(Record::Done(i, result)) => {
                    let job = batch
                        .get(i)
                        .ok_or("the driver process reported an unknown file")?;
                    report.file(job, result, &log);
                    log.clear();
                    current = None;
                    done = i + 1;
                }
                Some(Record::Fatal(message)) => {
                    let _ = child.wait();
                    return Err(with_log(message, &log));
                }
            }
        }
        let status = child
            .wait()
            .map_err(|e| format!("cannot wait for the driver process: {e}"))?;
        if done == batch.len() {
            break;
        }
        match current.and_then(|i| Some((i, batch.get(i)?))) {
            Some((i, job)) => {
                let died = Failure::new("driver", format!("the driver process died ({status})"));
                report.file(job, Err(died), &log);
                next += i + 1;
            }
            // Between two files: go on with the rest.
            None if done > 0 => next += done,
            None => {
                let message =
                    format!("the driver process ended ({status}) before compiling anything");
                return Err(with_log(message, &log));
            }
        }
    }
    Ok(())
}

fn with_log(message: String, log: &[String]) -> String {
    let mut text = message;
    for line in log.iter().filter(|l| !l.trim().is_empty()) {
        text.push_str("\n  ");
        text.push_str(line);
    }
    text
}

/// A private directory for the driver's runtime and cache directories, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for attempt in 0..100 {
            let path = base.join(format!("shader-stats-{}-{attempt}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Scratch(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(format!(
                        "cannot create a directory in {}: {e}",
                        base.display()
                    ))
                }
            }
        }
        Err(format!("cannot create a directory in {}", base.display()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Prints the results as they come and keeps the verdict.
struct Report<'a> {
    opts: &'a Options,
    total: usize,
    /// Files that do not compile (plain mode), or that fail the check, with why.
    failures: Vec<String>,
    /// With `--check`: files whose failures are exempt.
    exempted: Vec<String>,
    /// Whether the device line is out (each new driver process reports it again).
    device_shown: bool,
}

impl<'a> Report<'a> {
    fn new(opts: &'a Options, total: usize) -> Self {
        if opts.rules.is_some() {
            row(
                "file",
                ["VGPRs", "spill-V", "spill-S", "scratch", "LDS", "subgroups"],
                "status",
            );
        }
        Report {
            opts,
            total,
            failures: Vec::new(),
            exempted: Vec::new(),
            device_shown: false,
        }
    }

    fn device(&mut self, name: &str) {
        if self.opts.rules.is_none() && !self.device_shown {
            println!("device: {name}");
        }
        self.device_shown = true;
    }

    fn file(&mut self, job: &Job, result: Result<Compiled, Failure>, log: &[String]) {
        let path = job.path.display().to_string();
        match &self.opts.rules {
            Some(rules) => self.check_row(rules, &path, result, log),
            None => self.figures(job, &path, result, log),
        }
    }

    /// Plain mode: a heading and the figures, or the failure on stderr.
    fn figures(
        &mut self,
        job: &Job,
        path: &str,
        result: Result<Compiled, Failure>,
        log: &[String],
    ) {
        let compiled = match result {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "{}",
                    with_log(format!("error: {path}: {}: {}", e.stage, e.message), log)
                );
                self.failures.push(path.to_string());
                return;
            }
        };
        let checks = if job.checked { "on" } else { "off" };
        println!("{path} (entry {}, runtime checks {checks})", compiled.entry);
        let lines: Vec<(&str, &str, &str)> = if self.opts.all {
            let stats = compiled.stats.iter();
            stats
                .map(|s| (s.name.as_str(), s.value.as_str(), s.description.as_str()))
                .collect()
        } else {
            let value = |name| {
                compiled
                    .stats
                    .iter()
                    .find(|s| s.name == name)
                    .map_or("-", |s| s.value.as_str())
            };
            FIGURES
                .iter()
                .map(|&name| (name, value(name), ""))
                .collect()
        };
        let name_width = lines.iter().map(|l| l.0.len()).max().unwrap_or(0);
        let value_width = lines.iter().map(|l| l.1.len()).max().unwrap_or(0).max(6);
        for (name, value, description) in lines {
            let line = format!("  {name:<name_width$}  {value:>value_width$}  {description}");
            println!("{}", line.trim_end());
        }
        if self.opts.isa {
            for line in log {
                println!("{line}");
            }
        }
    }

    /// `--check`: one row, as `.ci/gpu-shader-stats` always printed it.
    fn check_row(
        &mut self,
        rules: &Rules,
        path: &str,
        result: Result<Compiled, Failure>,
        log: &[String],
    ) {
        let name = Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let exempt = rules
            .exempt
            .iter()
            .any(|prefix| name.starts_with(prefix.as_str()));
        let compiled = match result {
            Ok(c) => c,
            Err(e) => {
                if exempt {
                    self.exempted.push(path.to_string());
                    println!("{path:<50} exempt (does not compile)");
                } else {
                    eprintln!(
                        "{}",
                        with_log(format!("{path}: {}: {}", e.stage, e.message), log)
                    );
                    self.failures.push(format!("{path}: does not compile"));
                    println!("{path:<50} does not compile");
                }
                return;
            }
        };
        let columns = [
            "VGPRs",
            "Spilled VGPRs",
            "Spilled SGPRs",
            "Scratch size",
            "LDS size",
            "Subgroups per SIMD",
        ];
        let figures = columns.map(|n| compiled.figure(n));
        let problems = problems(rules, &figures);
        let status = if problems.is_empty() {
            "ok".to_string()
        } else if exempt {
            self.exempted.push(path.to_string());
            format!("exempt ({})", problems.join(", "))
        } else {
            self.failures
                .push(format!("{path}: {}", problems.join(", ")));
            format!("FAIL: {}", problems.join(", "))
        };
        let shown = figures.map(|f| f.map(|v| v.to_string()).unwrap_or_default());
        row(path, shown.each_ref().map(String::as_str), &status);
    }

    fn finish(self) -> Outcome {
        let Some(rules) = &self.opts.rules else {
            if self.failures.is_empty() {
                return Outcome::Ok;
            }
            eprintln!(
                "error: {} of {} files do not compile",
                self.failures.len(),
                self.total
            );
            return Outcome::Error;
        };
        let family = &self.opts.family;
        if !self.failures.is_empty() {
            eprintln!(
                "error: {} of {} shaders fail the {family} compiler check:",
                self.failures.len(),
                self.total
            );
            for f in &self.failures {
                eprintln!("  {f}");
            }
            return Outcome::CheckFailed;
        }
        println!(
            "{} shaders: no spills, no scratch, at least {} subgroups per SIMD on {family}",
            self.total - self.exempted.len(),
            rules.min_subgroups
        );
        if !self.exempted.is_empty() {
            println!(
                "{} exempt (known to fail, figures above):",
                self.exempted.len()
            );
            for f in &self.exempted {
                println!("  {f}");
            }
        }
        Outcome::Ok
    }
}

/// What fails the check, from the figures in table order (VGPRs, spilled VGPRs, spilled
/// SGPRs, scratch, LDS, subgroups per SIMD); `None`: the driver did not report it.
fn problems(rules: &Rules, figures: &[Option<u64>; 6]) -> Vec<String> {
    let [Some(_), Some(spill_v), Some(spill_s), Some(scratch), Some(_), Some(subgroups)] = *figures
    else {
        return vec!["unreadable figures".into()];
    };
    let mut problems = Vec::new();
    if spill_v > 0 {
        problems.push(format!("{spill_v} spilled VGPRs"));
    }
    if spill_s > 0 {
        problems.push(format!("{spill_s} spilled SGPRs"));
    }
    if scratch > 0 {
        problems.push(format!("{scratch} bytes of scratch"));
    }
    if subgroups < rules.min_subgroups {
        problems.push(format!(
            "{subgroups} subgroups per SIMD (fewer than {})",
            rules.min_subgroups
        ));
    }
    problems
}

/// One row of the `--check` table.
fn row(file: &str, figures: [&str; 6], status: &str) {
    let [vgprs, spill_v, spill_s, scratch, lds, subgroups] = figures;
    println!("{file:<50} {vgprs:>6} {spill_v:>7} {spill_s:>7} {scratch:>8} {lds:>6} {subgroups:>9}  {status}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_rules() {
        let rules = Rules {
            min_subgroups: 4,
            exempt: vec![],
        };
        assert!(problems(
            &rules,
            &[Some(24), Some(0), Some(0), Some(0), Some(8192), Some(16)]
        )
        .is_empty());
        assert_eq!(
            problems(
                &rules,
                &[Some(256), Some(3), Some(1), Some(512), Some(0), Some(2)]
            ),
            [
                "3 spilled VGPRs",
                "1 spilled SGPRs",
                "512 bytes of scratch",
                "2 subgroups per SIMD (fewer than 4)"
            ]
        );
        assert_eq!(
            problems(
                &rules,
                &[Some(24), None, Some(0), Some(0), Some(0), Some(16)]
            ),
            ["unreadable figures"]
        );
    }

    #[test]
    fn the_header_mark() {
        let dir = Scratch::new().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.0.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        assert!(marked_unchecked(&file(
            "a.wgsl",
            "// k\n// runtime checks: off\n"
        )));
        assert!(!marked_unchecked(&file(
            "b.wgsl",
            "1\n2\n3\n4\n5\n// runtime checks: off\n"
        )));
        assert!(!marked_unchecked(&dir.0.join("missing.wgsl")));
    }
}
