//! Minimal leveled logging to stderr, chosen by MADFS_LOG (error, warn, info,
//! debug; default warn). A dependency-free stand-in: servers log rarely and
//! only on unusual events.

use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

fn max_level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("MADFS_LOG").as_deref() {
        Ok("error") => Level::Error,
        Ok("info") => Level::Info,
        Ok("debug") => Level::Debug,
        _ => Level::Warn,
    })
}

pub fn enabled(level: Level) -> bool {
    level <= max_level()
}

pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if enabled(level) {
        let t = madfs_types::Timestamp::now();
        eprintln!("{}.{:03} {:?} {}", t.secs, t.nanos / 1_000_000, level, args);
    }
}

#[macro_export]
macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($arg)*)) };
}
#[macro_export]
macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($arg)*)) };
}
#[macro_export]
macro_rules! log_error {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($arg)*)) };
}
#[macro_export]
macro_rules! log_debug {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($arg)*)) };
}
