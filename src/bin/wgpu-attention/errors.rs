//! How the binary reports failure: always one line `error: …` on stderr, and an exit status
//! of 0 (success), 1 (a failure: a bad input file, no adapter, a failed `verify`) or 2 (a
//! usage error: an unknown, malformed or missing argument). Usage text only on `--help`.

use std::process::ExitCode;

/// The exit status and help text's account of the exit statuses.
pub const EXIT_STATUS_HELP: &str = "Exit status: 0 success; 1 failure (unreadable or bad \
input, no GPU adapter, a failed verify); 2 usage error (unknown, malformed or missing \
argument). Errors are one line `error: …` on stderr.";

/// Exit status of a usage error.
pub const USAGE: u8 = 2;

/// Reports a failure of a command as one line and gives its exit status (1).
pub fn fail(e: &wgpu_attention::Error) -> ExitCode {
    eprintln!("error: {}", one_line(&e.to_string()));
    ExitCode::FAILURE
}

/// Handles an argument-parser outcome that is not a parsed command line: help and version
/// are printed as asked (status 0); every error becomes one line (status 2).
pub fn parse_failure(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Printing help to a closed pipe is not worth an error.
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => {
            let line = clap_one_line(&e.render().to_string(), e.kind(), &command_path());
            eprintln!("{line}");
            ExitCode::from(USAGE)
        }
    }
}

/// Collapses a message to one line: line breaks and runs of blanks become single spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The command line's command, for "see `… --help`": the binary and the subcommand when
/// the arguments name one (the first argument that is not an option).
fn command_path() -> String {
    let bin = env!("CARGO_BIN_NAME");
    let sub = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cli = <crate::Cli as clap::CommandFactory>::command();
    match sub.and_then(|s| cli.find_subcommand(&s).map(|c| c.get_name().to_string())) {
        Some(sub) => format!("{bin} {sub}"),
        None => bin.to_string(),
    }
}

/// clap's rendered error (its message, any list of arguments and tips, then the usage and
/// "For more information") as one line: the message, list items joined by commas, tips
/// after semicolons, and where to find `command`'s usage.
fn clap_one_line(rendered: &str, kind: clap::error::ErrorKind, command: &str) -> String {
    let mut message = String::new();
    let mut in_list = false;
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") {
            break;
        }
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        let sep = if message.is_empty() {
            ""
        } else if message.ends_with(':') {
            " "
        } else if line.starts_with("tip:") {
            in_list = false;
            "; "
        } else if in_list {
            ", "
        } else {
            " "
        };
        message.push_str(sep);
        message.push_str(&one_line(line));
        if line.ends_with(':') {
            in_list = true;
        }
    }
    if kind == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        message = "a command is needed: devices, run, sdpa, verify, bench or demo".into();
    }
    let message = message.strip_prefix("error:").unwrap_or(&message).trim();
    format!("error: {message} (see `{command} --help`)")
}

/// Makes a panic (a bug) print one line `error: internal error …` instead of the default
/// report; with `RUST_BACKTRACE` set, the default report follows it.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error (a bug; please report it): {}{at}",
            one_line(&what)
        );
        if std::env::var_os("RUST_BACKTRACE").is_some() {
            default(info);
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    #[test]
    fn a_missing_argument_list_and_tips_fold_into_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  \
            --wk <WK>\n  --wv <WV>\n\nUsage: wgpu-attention run --x <X> --out <OUT> --wq <WQ>\n\n\
            For more information, try '--help'.\n";
        assert_eq!(
            clap_one_line(
                rendered,
                ErrorKind::MissingRequiredArgument,
                "wgpu-attention run"
            ),
            "error: the following required arguments were not provided: --wk <WK>, --wv <WV> \
             (see `wgpu-attention run --help`)"
        );
        let rendered = "error: unexpected argument '--head' found\n\n  tip: a similar argument \
            exists: '--heads'\n\nUsage: wgpu-attention run [OPTIONS] --x <X>\n\nFor more \
            information, try '--help'.\n";
        assert_eq!(
            clap_one_line(rendered, ErrorKind::UnknownArgument, "wgpu-attention run"),
            "error: unexpected argument '--head' found; tip: a similar argument exists: \
             '--heads' (see `wgpu-attention run --help`)"
        );
    }

    #[test]
    fn messages_lose_their_line_breaks() {
        assert_eq!(one_line("a\n  b\tc "), "a b c");
    }
}
