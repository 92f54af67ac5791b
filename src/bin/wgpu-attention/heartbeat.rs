//! A progress line on stderr every few seconds while a long command runs without a terminal
//! (CI logs, a pipe), where the progress bar draws nothing: a bench or report that has
//! printed nothing for a while says what it is measuring and for how long it has been.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

/// How often a hidden progress bar is reported.
pub const EVERY: Duration = Duration::from_secs(10);

/// Reports `progress` on stderr every [`EVERY`] while it is hidden; stops when dropped.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts reporting `progress` as `name` (nothing happens while it draws itself).
    pub fn start(name: &'static str, progress: &ProgressBar) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (bar, flag) = (progress.clone(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut next = start + EVERY;
            while !flag.load(Ordering::Relaxed) {
                std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
                if flag.load(Ordering::Relaxed) || Instant::now() < next {
                    continue;
                }
                next += EVERY;
                if bar.is_hidden() {
                    eprintln!(
                        "{name}: {}/{} {} ({:.0} s)",
                        bar.position(),
                        bar.length().unwrap_or(0),
                        bar.message(),
                        start.elapsed().as_secs_f64()
                    );
                }
            }
        });
        Heartbeat {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
