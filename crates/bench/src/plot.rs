//! An SVG grouped bar chart of runs: one group per phase (and the three
//! scores), one bar per run. Bars are normalized per group (the best run of
//! a phase is full height) since phases differ by orders of magnitude; each
//! bar is labeled with its value.

use crate::report::RunResult;

const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The chart of `runs` as an SVG document.
pub fn svg(runs: &[RunResult]) -> String {
    // Groups: the phases of the first run (then any others' extra ones),
    // and the three IO500 numbers.
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in runs {
        for p in &r.phases {
            if !groups.iter().any(|(n, _)| *n == p.name) {
                groups.push((p.name.clone(), p.unit.clone()));
            }
        }
    }
    for (n, u) in [("bw", "GiB/s"), ("md", "kIOPS"), ("score", "")] {
        groups.push((format!("score:{n}"), u.to_string()));
    }
    let value = |r: &RunResult, g: &str| -> Option<f64> {
        match g {
            "score:bw" => Some(r.bw_gib_s),
            "score:md" => Some(r.md_kiops),
            "score:score" => Some(r.score),
            _ => r.phase(g).map(|p| p.value),
        }
    };
    let nruns = runs.len().max(1);
    let bar_w = 18.0;
    let group_w = bar_w * nruns as f64 + 24.0;
    let (left, top, plot_h) = (60.0, 50.0, 300.0);
    let legend_h = 20.0 * runs.len() as f64;
    let width = left + group_w * groups.len() as f64 + 20.0;
    let height = top + plot_h + 130.0 + legend_h;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"16\">IO500 phases (bars normalized per phase: \
         tallest = best run; labels are values)</text>\n"
    );
    // Axis and gridlines at 0, 25, ..., 100 %.
    for k in 0..=4 {
        let y = top + plot_h * (1.0 - k as f64 / 4.0);
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}%</text>\n",
            width - 20.0,
            left - 4.0,
            y + 4.0,
            k * 25
        ));
    }
    for (gi, (g, unit)) in groups.iter().enumerate() {
        let gx = left + group_w * gi as f64 + 12.0;
        let best = runs
            .iter()
            .filter_map(|r| value(r, g))
            .fold(0.0f64, f64::max);
        for (ri, r) in runs.iter().enumerate() {
            let Some(v) = value(r, g) else { continue };
            let frac = if best > 0.0 { v / best } else { 0.0 };
            let h = plot_h * frac;
            let x = gx + bar_w * ri as f64;
            let y = top + plot_h - h;
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\">\
                 <title>{} {}: {} {}</title></rect>\n",
                bar_w - 2.0,
                COLORS[ri % COLORS.len()],
                esc(&r.label),
                esc(g),
                fmt_value(v),
                esc(unit)
            ));
            let (tx, ty) = (x + bar_w / 2.0 + 3.0, y - 3.0);
            s.push_str(&format!(
                "<text x=\"{tx:.1}\" y=\"{ty:.1}\" font-size=\"9\" \
                 transform=\"rotate(-90 {tx:.1} {ty:.1})\">{}</text>\n",
                fmt_value(v)
            ));
        }
        let lx = gx + bar_w * nruns as f64 / 2.0;
        let ly = top + plot_h + 12.0;
        let label = if unit.is_empty() {
            esc(g)
        } else {
            format!("{} ({})", esc(g), esc(unit))
        };
        s.push_str(&format!(
            "<text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"end\" \
             transform=\"rotate(-45 {lx:.1} {ly:.1})\">{label}</text>\n"
        ));
    }
    let ly0 = top + plot_h + 125.0;
    for (ri, r) in runs.iter().enumerate() {
        let y = ly0 + 20.0 * ri as f64;
        s.push_str(&format!(
            "<rect x=\"{left}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{y:.1}\">{} — {}, {} ranks, stonewall {} s, scale {}, \
             score {:.4}</text>\n",
            y - 10.0,
            COLORS[ri % COLORS.len()],
            left + 18.0,
            esc(&r.label),
            esc(&r.target),
            r.ranks,
            r.stonewall_s,
            esc(&r.scale),
            r.score
        ));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::run_with;
    use crate::PHASES;

    #[test]
    fn two_runs_chart_has_every_phase_and_both_runs() {
        let a = run_with("madfs-4", &[2.0; 12]);
        let b = run_with("local<dir>", &[1.0; 12]);
        let out = svg(&[a, b]);
        assert!(out.starts_with("<svg"));
        assert!(out.trim_end().ends_with("</svg>"));
        for (name, _) in PHASES {
            assert!(out.contains(&format!(">{name} (")), "no group for {name}");
        }
        assert!(out.contains("madfs-4"));
        assert!(out.contains("local&lt;dir&gt;"));
        // 12 phases + 3 scores, 2 bars each, plus the 2 legend boxes and the background.
        assert_eq!(out.matches("<rect").count(), 15 * 2 + 2 + 1);
    }
}
