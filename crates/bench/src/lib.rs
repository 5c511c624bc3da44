//! `madfs bench io500`: the IO500 phases (ior-easy, ior-hard, mdtest-easy,
//! mdtest-hard, find) with IO500's parameters, scaled in time (the
//! stonewall) and in file counts, run by separate rank processes against
//! MadFS or, as a baseline, against a local directory.
//!
//! - [`engine`]: the operations the phases need, over MadFS's client
//!   library or `std::fs` (a local directory, or MadFS through `madfs run`
//!   or the FUSE mount);
//! - [`rank`]: what one rank process does, driven over stdin/stdout;
//! - [`coord`]: the parent: spawns the ranks, sets up, runs the phases
//!   behind a barrier, times them, checks counts;
//! - [`report`]: results, IO500's score, `[RESULT]` lines, JSON;
//! - [`plot`]: an SVG bar chart of one or more runs.

pub mod coord;
pub mod engine;
pub mod pattern;
pub mod plot;
pub mod rank;
pub mod report;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// IO500's ior-hard transfer size (bytes), one segment per rank.
pub const IOR_HARD_XFER: u64 = 47_008;
/// IO500's mdtest-hard file size (bytes).
pub const MD_HARD_BYTES: u64 = 3_901;
/// IO500's find pattern on names.
pub const FIND_NAME: &str = "*01*";

/// Where the benchmark runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Target {
    /// A MadFS cluster through the client library (cluster file; None:
    /// $MADFS_CLUSTER, else the default).
    Madfs { cluster: Option<PathBuf> },
    /// A directory of the local file system, through the kernel.
    Local { dir: PathBuf },
    /// A MadFS cluster through one of its user-facing clients: the ranks
    /// use `std::fs` on paths under `root`, which is MadFS's `/` (the
    /// `madfs run` prefix, the ranks having the interception library
    /// preloaded; or a FUSE mount point). Setup, cleanup and the find phase
    /// (the server-side find) use the cluster directly.
    Client {
        client: ClientKind,
        root: PathBuf,
        cluster: PathBuf,
    },
}

/// The user-facing clients a run can go through.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// `madfs run`: the interception library (LD_PRELOAD).
    Run,
    /// `madfs mount`: the FUSE mount.
    Mount,
}

impl ClientKind {
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Run => "run",
            ClientKind::Mount => "mount",
        }
    }
}

impl Target {
    pub fn describe(&self) -> String {
        match self {
            Target::Madfs { .. } | Target::Client { .. } => "madfs".into(),
            Target::Local { dir } => format!("local:{}", dir.display()),
        }
    }

    /// How the ranks reach the target: "library" (MadFS's client library),
    /// "run", "mount", or "kernel" (a local directory).
    pub fn client(&self) -> &'static str {
        match self {
            Target::Madfs { .. } => "library",
            Target::Client { client, .. } => client.name(),
            Target::Local { .. } => "kernel",
        }
    }

    /// The engine of a rank.
    pub fn connect(&self) -> engine::Result<Box<dyn engine::Engine>> {
        Ok(match self {
            Target::Madfs { cluster } => {
                Box::new(engine::MadfsEngine::connect(cluster.as_deref())?)
            }
            Target::Local { .. } => Box::new(engine::LocalEngine),
            Target::Client {
                client,
                root,
                cluster,
            } => Box::new(engine::ClientEngine::connect(*client, root, cluster)?),
        })
    }

    /// The engine of the parent, which makes the run directory and removes
    /// it (not timed): the library for a user-facing client, whose paths
    /// the parent process may not see (it is not preloaded).
    pub fn setup_engine(&self) -> engine::Result<Box<dyn engine::Engine>> {
        match self {
            Target::Client { cluster, .. } => {
                Ok(Box::new(engine::MadfsEngine::connect(Some(cluster))?))
            }
            other => other.connect(),
        }
    }

    /// A path of the ranks' namespace in the setup engine's.
    pub fn setup_path(&self, path: &str) -> String {
        match self {
            Target::Client { root, .. } => engine::fs_path(root, path),
            _ => path.to_string(),
        }
    }
}

/// How much read data the read phases check against the pattern.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    None,
    /// Every 16th transfer whole, the first 64 bytes of the others; every
    /// mdtest-hard file whole.
    Sample,
    All,
}

/// Per-rank upper bounds of the write phases (the stonewall usually stops
/// them first), from the scale.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limits {
    /// ior-easy bytes per rank (its file's size at most).
    pub ior_easy_bytes: u64,
    /// ior-hard segments (47,008-byte transfers) per rank.
    pub ior_hard_segments: u64,
    pub md_easy_files: u64,
    pub md_hard_files: u64,
}

/// A named size of run. `official` is IO500's own (limits that only the
/// 300 s stonewall reaches); the others shrink counts and time alike.
pub fn scale(name: &str) -> Option<(Limits, f64)> {
    const MIB: u64 = 1 << 20;
    Some(match name {
        "tiny" => (
            Limits {
                ior_easy_bytes: 8 * MIB,
                ior_hard_segments: 64,
                md_easy_files: 200,
                md_hard_files: 200,
            },
            1.0,
        ),
        "small" => (
            Limits {
                ior_easy_bytes: 1024 * MIB,
                ior_hard_segments: 20_000,
                md_easy_files: 50_000,
                md_hard_files: 20_000,
            },
            10.0,
        ),
        "medium" => (
            Limits {
                ior_easy_bytes: 8192 * MIB,
                ior_hard_segments: 200_000,
                md_easy_files: 500_000,
                md_hard_files: 200_000,
            },
            60.0,
        ),
        "official" => (
            Limits {
                ior_easy_bytes: 9_920_000 * MIB,
                ior_hard_segments: 10_000_000,
                md_easy_files: 10_000_000,
                md_hard_files: 10_000_000,
            },
            300.0,
        ),
        _ => return None,
    })
}

pub const SCALES: &[&str] = &["tiny", "small", "medium", "official"];

/// Everything a run needs; the parent sends it to every rank.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Config {
    pub target: Target,
    /// The run's directory in the target's namespace (made by the parent).
    pub workdir: String,
    pub ranks: usize,
    /// Write phases stop each rank after this many seconds (then every rank
    /// catches up to the largest count, as IO500's wear-out does).
    pub stonewall_s: f64,
    pub scale: String,
    pub limits: Limits,
    /// ior-easy transfer size (bytes; a multiple of 8).
    pub transfer: u64,
    pub verify: Verify,
    /// Leave the files in place after the run.
    pub keep: bool,
}

/// Whether a phase is scored as bandwidth (GiB/s) or metadata (kIOPS).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Bw,
    Md,
}

/// IO500's phases in IO500's order.
pub const PHASES: [(&str, Kind); 12] = [
    ("ior-easy-write", Kind::Bw),
    ("mdtest-easy-write", Kind::Md),
    ("ior-hard-write", Kind::Bw),
    ("mdtest-hard-write", Kind::Md),
    ("find", Kind::Md),
    ("ior-easy-read", Kind::Bw),
    ("mdtest-easy-stat", Kind::Md),
    ("ior-hard-read", Kind::Bw),
    ("mdtest-hard-stat", Kind::Md),
    ("mdtest-easy-delete", Kind::Md),
    ("mdtest-hard-read", Kind::Md),
    ("mdtest-hard-delete", Kind::Md),
];

/// The ior-hard offset of `segment` of `rank` among `ranks`: segments are
/// interleaved by rank, each IOR_HARD_XFER bytes.
pub fn ior_hard_offset(segment: u64, rank: usize, ranks: usize) -> u64 {
    (segment * ranks as u64 + rank as u64) * IOR_HARD_XFER
}

/// Name of mdtest file `i` of `rank` (as mdtest names them).
pub fn md_name(rank: usize, i: u64) -> String {
    format!("file.mdtest.{rank}.{i}")
}

/// Wall-clock time as seconds since the epoch (ranks run on one clock, or
/// on synchronized ones).
pub fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ior_hard_offsets_tile_the_file() {
        for ranks in [1usize, 2, 3, 4, 7] {
            let segments = 9u64;
            let mut ranges: Vec<(u64, u64)> = (0..segments)
                .flat_map(|s| {
                    (0..ranks).map(move |r| {
                        let o = ior_hard_offset(s, r, ranks);
                        (o, o + IOR_HARD_XFER)
                    })
                })
                .collect();
            ranges.sort();
            assert_eq!(ranges[0].0, 0);
            for w in ranges.windows(2) {
                assert_eq!(w[0].1, w[1].0, "gap or overlap with {ranks} ranks");
            }
            assert_eq!(
                ranges.last().unwrap().1,
                segments * ranks as u64 * IOR_HARD_XFER
            );
        }
        // Interleaved by rank within a segment.
        assert_eq!(ior_hard_offset(0, 1, 4), 47_008);
        assert_eq!(ior_hard_offset(1, 0, 4), 4 * 47_008);
        assert_eq!(ior_hard_offset(2, 3, 4), 11 * 47_008);
    }

    #[test]
    fn config_round_trips_through_json() {
        let (limits, sw) = scale("tiny").unwrap();
        let c = Config {
            target: Target::Local {
                dir: "/tmp/x".into(),
            },
            workdir: "/tmp/x/io500.1".into(),
            ranks: 3,
            stonewall_s: sw,
            scale: "tiny".into(),
            limits,
            transfer: 1 << 20,
            verify: Verify::Sample,
            keep: false,
        };
        let s = serde_json::to_string(&c).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<Config>(&s).unwrap(), c);
    }
}
