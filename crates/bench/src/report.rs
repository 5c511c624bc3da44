//! Results: one [`PhaseResult`] per phase, a [`RunResult`] per run with
//! IO500's score, the `[RESULT]` lines, JSON files holding one or more runs,
//! and the side-by-side comparison of two runs.

use crate::Kind;
use serde::{Deserialize, Serialize};

pub const GIB: f64 = (1u64 << 30) as f64;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseResult {
    pub name: String,
    pub kind: Kind,
    /// GiB/s (bandwidth phases) or kIOPS (metadata phases and find).
    pub value: f64,
    pub unit: String,
    /// First rank's start to last rank's end (seconds).
    pub time_s: f64,
    /// Operations over all ranks (transfers, files; entries scanned by find).
    pub ops: u64,
    pub bytes: u64,
    /// Operations of each rank.
    pub per_rank: Vec<u64>,
    /// Verification failures (data, sizes, find's match count).
    pub errors: u64,
    /// Find only: files matching every filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<u64>,
}

impl PhaseResult {
    /// A phase's result from its totals, valued as IO500 does.
    pub fn new(name: &str, kind: Kind, time_s: f64, per_rank: Vec<u64>, bytes: u64) -> PhaseResult {
        let ops: u64 = per_rank.iter().sum();
        let t = time_s.max(1e-9);
        let (value, unit) = match kind {
            Kind::Bw => (bytes as f64 / GIB / t, "GiB/s"),
            Kind::Md => (ops as f64 / t / 1000.0, "kIOPS"),
        };
        PhaseResult {
            name: name.to_string(),
            kind,
            value,
            unit: unit.to_string(),
            time_s,
            ops,
            bytes,
            per_rank,
            errors: 0,
            matched: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// What the chart and the comparison call this run.
    pub label: String,
    pub target: String,
    /// How the ranks reached the target: library, run, mount, kernel
    /// (empty in files written before it was recorded).
    #[serde(default)]
    pub client: String,
    /// How the find phase ran: "server-side find" (every MadFS client) or
    /// "walk through std::fs" (a local directory).
    #[serde(default)]
    pub find_via: String,
    pub ranks: usize,
    pub stonewall_s: f64,
    pub scale: String,
    pub transfer: u64,
    pub verify: String,
    pub started_unix_s: f64,
    pub phases: Vec<PhaseResult>,
    /// Geometric mean of the bandwidth phases (GiB/s).
    pub bw_gib_s: f64,
    /// Geometric mean of the metadata phases, find included (kIOPS).
    pub md_kiops: f64,
    /// sqrt(bw * md), as IO500.
    pub score: f64,
    pub errors: u64,
}

/// A JSON results file: one or more runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Report {
    pub runs: Vec<RunResult>,
}

/// Geometric mean; 0 if any value is not positive (IO500 scores an invalid
/// or zero phase as 0) or there are none.
pub fn geomean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|&v| v.is_nan() || v <= 0.0) {
        return 0.0;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// IO500's three numbers: (bandwidth geomean, metadata geomean, score).
pub fn score(phases: &[PhaseResult]) -> (f64, f64, f64) {
    let of = |k: Kind| -> Vec<f64> {
        phases
            .iter()
            .filter(|p| p.kind == k)
            .map(|p| p.value)
            .collect()
    };
    let bw = geomean(&of(Kind::Bw));
    let md = geomean(&of(Kind::Md));
    (bw, md, (bw * md).sqrt())
}

impl RunResult {
    /// Fill in the score and the error total from the phases.
    pub fn finish(&mut self) {
        let (bw, md, s) = score(&self.phases);
        self.bw_gib_s = bw;
        self.md_kiops = md;
        self.score = s;
        self.errors = self.phases.iter().map(|p| p.errors).sum();
    }

    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// The `[RESULT]` line of a phase, as IO500 prints it.
pub fn result_line(p: &PhaseResult) -> String {
    let mut s = format!(
        "[RESULT] {:>20} {:14.6} {:<5} : time {:9.3} seconds",
        p.name, p.value, p.unit, p.time_s
    );
    if let Some(m) = p.matched {
        s.push_str(&format!(" (scanned {}, matched {m})", p.ops));
    }
    if p.errors > 0 {
        s.push_str(&format!(" [{} ERRORS]", p.errors));
    }
    s
}

/// Every line of a run's summary: the `[RESULT]`s and the `[SCORE ]`.
pub fn summary(r: &RunResult) -> String {
    let mut out = format!(
        "# {}: target {}, client {}, {} ranks, stonewall {} s, scale {}; find: {}\n",
        r.label, r.target, r.client, r.ranks, r.stonewall_s, r.scale, r.find_via
    );
    for p in &r.phases {
        out.push_str(&result_line(p));
        if p.matched.is_some() && !r.find_via.is_empty() {
            out.push_str(&format!(" [{}]", r.find_via));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "[SCORE ] Bandwidth {:.6} GiB/s : IOPS {:.6} kiops : TOTAL {:.6}{}\n",
        r.bw_gib_s,
        r.md_kiops,
        r.score,
        if r.errors > 0 {
            format!(" [INVALID: {} verification errors]", r.errors)
        } else {
            String::new()
        }
    ));
    out
}

/// A table of two runs phase by phase with `a / b` ratios.
pub fn compare(a: &RunResult, b: &RunResult) -> String {
    let mut out = format!(
        "{:>20} {:>14} {:>14} {:>8}\n",
        "phase", a.label, b.label, "ratio"
    );
    let ratio = |x: f64, y: f64| {
        if y > 0.0 {
            format!("{:.2}x", x / y)
        } else {
            "-".into()
        }
    };
    for p in &a.phases {
        if let Some(q) = b.phase(&p.name) {
            out.push_str(&format!(
                "{:>20} {:>14.4} {:>14.4} {:>8}  {}\n",
                p.name,
                p.value,
                q.value,
                ratio(p.value, q.value),
                p.unit
            ));
        }
    }
    for (name, x, y, unit) in [
        ("bandwidth", a.bw_gib_s, b.bw_gib_s, "GiB/s"),
        ("metadata", a.md_kiops, b.md_kiops, "kIOPS"),
        ("score", a.score, b.score, ""),
    ] {
        out.push_str(&format!(
            "{:>20} {:>14.4} {:>14.4} {:>8}  {unit}\n",
            name,
            x,
            y,
            ratio(x, y)
        ));
    }
    out
}

pub fn to_json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("results serialize")
}

pub fn from_json(text: &str) -> Result<Report, String> {
    serde_json::from_str(text).map_err(|e| format!("not a bench results file: {e}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::PHASES;

    /// A run whose phases have the given values, in PHASES order.
    pub fn run_with(label: &str, values: &[f64; 12]) -> RunResult {
        let phases = PHASES
            .iter()
            .zip(values)
            .map(|(&(name, kind), &v)| {
                let mut p = PhaseResult::new(name, kind, 2.0, vec![1, 2], 3);
                p.value = v;
                p
            })
            .collect();
        let mut r = RunResult {
            label: label.into(),
            target: "madfs".into(),
            client: "library".into(),
            find_via: "server-side find".into(),
            ranks: 2,
            stonewall_s: 1.0,
            scale: "tiny".into(),
            transfer: 1 << 20,
            verify: "all".into(),
            started_unix_s: 1.5,
            phases,
            bw_gib_s: 0.0,
            md_kiops: 0.0,
            score: 0.0,
            errors: 0,
        };
        r.finish();
        r
    }

    #[test]
    fn score_matches_io500_formula() {
        // PHASES order: ior-easy-write(bw) mdtest-easy-write(md)
        // ior-hard-write(bw) mdtest-hard-write(md) find(md) ior-easy-read(bw)
        // mdtest-easy-stat(md) ior-hard-read(bw) mdtest-hard-stat(md)
        // mdtest-easy-delete(md) mdtest-hard-read(md) mdtest-hard-delete(md).
        // bw: 2, 8, 1, 4: product 64, 4th root 2*sqrt(2) = 2.828427...
        // md: 2 x7 and find 256: product 2^7 * 2^8 = 2^15, 8th root 2^1.875.
        // score = sqrt(2^1.5 * 2^1.875) = 2^1.6875 = 3.2209807...
        let r = run_with(
            "a",
            &[2.0, 2.0, 8.0, 2.0, 256.0, 1.0, 2.0, 4.0, 2.0, 2.0, 2.0, 2.0],
        );
        assert!((r.bw_gib_s - 2.0 * 2f64.sqrt()).abs() < 1e-12);
        assert!((r.md_kiops - 2f64.powf(1.875)).abs() < 1e-12);
        assert!((r.score - 2f64.powf(1.6875)).abs() < 1e-12);
        assert!((r.score - 3.220_980_7).abs() < 1e-6);
        // A zero phase zeroes its mean and the score.
        let z = run_with(
            "z",
            &[2.0, 2.0, 8.0, 2.0, 0.0, 1.0, 2.0, 4.0, 2.0, 2.0, 2.0, 2.0],
        );
        assert_eq!(z.md_kiops, 0.0);
        assert_eq!(z.score, 0.0);
        assert!(z.bw_gib_s > 0.0);
    }

    #[test]
    fn phase_values_use_io500_units() {
        let p = PhaseResult::new("ior-easy-write", Kind::Bw, 2.0, vec![3, 1], 4 << 30);
        assert_eq!(p.value, 2.0);
        assert_eq!(p.unit, "GiB/s");
        let p = PhaseResult::new("mdtest-easy-write", Kind::Md, 0.5, vec![1000, 500], 0);
        assert_eq!(p.ops, 1500);
        assert_eq!(p.value, 3.0);
        assert_eq!(p.unit, "kIOPS");
    }

    #[test]
    fn json_round_trip() {
        let mut a = run_with("madfs", &[1.5; 12]);
        a.phases[4].matched = Some(17);
        let rep = Report {
            runs: vec![a, run_with("local", &[0.75; 12])],
        };
        let text = to_json(&rep);
        assert_eq!(from_json(&text).unwrap(), rep);
        assert!(from_json("{\"nope\": 1}").is_err());
        // Files written before the client was recorded still read.
        let old = text
            .replace("\"client\": \"library\",", "")
            .replace("\"find_via\": \"server-side find\",", "");
        assert!(!old.contains("client"), "{old}");
        assert_eq!(from_json(&old).unwrap().runs[0].client, "");
        let table = compare(&rep.runs[0], &rep.runs[1]);
        assert!(table.contains("2.00x"), "{table}");
        assert!(summary(&rep.runs[0]).contains("[RESULT]"));
    }
}
