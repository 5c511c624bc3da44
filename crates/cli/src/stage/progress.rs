//! What a copy shows people: on a terminal a progress bar (files, bytes,
//! rate, time left) through indicatif; elsewhere (a job's log) nothing but
//! the errors, each on its own line as it happens, and one summary line at
//! the end.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Progress {
    command: &'static str,
    bar: Option<ProgressBar>,
    started: Instant,
    files_total: u64,
    files_done: u64,
    bytes_done: u64,
}

/// `n` bytes as people read them: 1.5 GiB.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

impl Progress {
    /// A display for `files` entries and `bytes` bytes to copy; a bar only
    /// when standard error is a terminal and `show` allows it.
    pub fn new(command: &'static str, files: u64, bytes: u64, show: bool) -> Progress {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} \
                 {binary_bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let mut p = Progress {
            command,
            bar,
            started: Instant::now(),
            files_total: files,
            files_done: 0,
            bytes_done: 0,
        };
        p.show_files();
        p
    }

    fn show_files(&mut self) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{}/{} files", self.files_done, self.files_total));
        }
    }

    /// More to do than planned (sync --checksum found differences).
    pub fn grow(&mut self, files: u64, bytes: u64) {
        self.files_total += files;
        if let Some(bar) = &self.bar {
            bar.inc_length(bytes);
        }
        self.show_files();
    }

    /// Follow `live`, bytes written as they are written (by this
    /// process's tasks), between the reports of whole items.
    pub fn follow(&self, live: Arc<AtomicU64>) {
        let Some(bar) = self.bar.clone() else {
            return;
        };
        tokio::spawn(async move {
            while !bar.is_finished() {
                bar.set_position(bar.position().max(live.load(Ordering::Relaxed)));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    pub fn advance(&mut self, files: u64, bytes: u64) {
        self.files_done += files;
        self.bytes_done += bytes;
        if let Some(bar) = &self.bar {
            bar.set_position(bar.position().max(self.bytes_done));
        }
        if files > 0 {
            self.show_files();
        }
    }

    /// Print an error (above the bar, which then redraws).
    pub fn error(&self, msg: &str) {
        let line = format!("madfs {}: {msg}", self.command);
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    pub fn files_done(&self) -> u64 {
        self.files_done
    }

    pub fn bytes_done(&self) -> u64 {
        self.bytes_done
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Take the bar off the screen (before the summary is printed).
    pub fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_people_read_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB");
    }
}
