//! The timeline as an SVG picture: one lane per task with coloured state bands, markers with
//! tooltips, a time axis whose long quiet gaps are compressed, and a legend.

use std::fmt::Write as _;

use crate::clock::format_ms;
use crate::core::{Millis, TaskState};
use crate::replay::diff::shorten;

use super::model::{MarkKind, Timeline};
use super::summary::{clock_time, fmt_dur};

/// The fill colour of a state band.
pub fn state_colour(s: TaskState) -> &'static str {
    match s {
        TaskState::Idle => "#cfd4dc",
        TaskState::Provisioning => "#f2c14e",
        TaskState::Running => "#4caf7a",
        TaskState::Snapshotting => "#4a90d9",
        TaskState::Expired => "#b39ddb",
        TaskState::Restoring => "#2bb5b5",
    }
}

/// Escapes text for XML/HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            '\'' => s.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => s.push(' '),
            c => s.push(c),
        }
    }
    s
}

const WIDTH: f64 = 1200.0;
const LABEL_W: f64 = 170.0;
const RIGHT_PAD: f64 = 30.0;
const TOP: f64 = 78.0;
const LANE_H: f64 = 78.0;
const BAND_H: f64 = 24.0;
const GAP_W: f64 = 44.0;

/// A time axis that is linear except for long quiet gaps, each drawn [`GAP_W`] wide.
struct Scale {
    segs: Vec<Seg>,
    /// Pixels per millisecond on the linear parts.
    k: f64,
}

struct Seg {
    t0: Millis,
    t1: Millis,
    x0: f64,
    x1: f64,
    gap: bool,
}

impl Scale {
    fn new(mut times: Vec<Millis>, x0: f64, x1: f64) -> Scale {
        times.sort_unstable();
        times.dedup();
        let (first, last) = match (times.first(), times.last()) {
            (Some(&f), Some(&l)) if l > f => (f, l),
            (Some(&f), _) => {
                return Scale {
                    segs: vec![Seg {
                        t0: f,
                        t1: f + 1,
                        x0,
                        x1,
                        gap: false,
                    }],
                    k: (x1 - x0),
                }
            }
            (None, _) => {
                return Scale {
                    segs: vec![Seg {
                        t0: 0,
                        t1: 1,
                        x0,
                        x1,
                        gap: false,
                    }],
                    k: (x1 - x0),
                }
            }
        };
        let span = last - first;
        let threshold = (span / 8).max(2_000);
        let pairs: Vec<(Millis, Millis)> = times.windows(2).map(|w| (w[0], w[1])).collect();
        let gaps = pairs.iter().filter(|(a, b)| b - a > threshold).count();
        let linear: u64 = pairs
            .iter()
            .filter(|(a, b)| b - a <= threshold)
            .map(|(a, b)| b - a)
            .sum();
        let width = x1 - x0;
        // Compress only when it leaves most of the width to the activity.
        let compress = gaps > 0 && linear > 0 && (gaps as f64) * GAP_W < width * 0.5;
        if !compress {
            return Scale {
                segs: vec![Seg {
                    t0: first,
                    t1: last,
                    x0,
                    x1,
                    gap: false,
                }],
                k: width / span as f64,
            };
        }
        let k = (width - gaps as f64 * GAP_W) / linear as f64;
        let mut segs = Vec::new();
        let mut x = x0;
        for (a, b) in pairs {
            let gap = b - a > threshold;
            let w = if gap { GAP_W } else { (b - a) as f64 * k };
            segs.push(Seg {
                t0: a,
                t1: b,
                x0: x,
                x1: x + w,
                gap,
            });
            x += w;
        }
        Scale { segs, k }
    }

    fn x(&self, t: Millis) -> f64 {
        let first = &self.segs[0];
        if t <= first.t0 {
            return first.x0;
        }
        for s in &self.segs {
            if t <= s.t1 {
                let f = (t - s.t0) as f64 / (s.t1 - s.t0).max(1) as f64;
                return s.x0 + f * (s.x1 - s.x0);
            }
        }
        self.segs.last().map_or(first.x1, |s| s.x1)
    }
}

const TICK_STEPS: [u64; 26] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000,
    120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 43_200_000,
    86_400_000,
];

/// An axis label: the offset from the start, as precise as the tick step needs.
fn fmt_offset(ms: u64, step: u64) -> String {
    if ms == 0 {
        "0".to_string()
    } else if ms < 1000 {
        format!("+{ms}ms")
    } else if ms < 60_000 || step < 1000 {
        let decimals = match step {
            0..=9 => 3,
            10..=99 => 2,
            100..=999 => 1,
            _ => 0,
        };
        format!("+{:.*}s", decimals, ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("+{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("+{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

/// The picture: one lane per task with coloured state bands, markers, a time axis and a legend.
pub fn render_svg(timelines: &[Timeline]) -> String {
    let mut times: Vec<Millis> = Vec::new();
    for tl in timelines {
        times.extend(tl.bands.iter().flat_map(|b| [b.from, b.to]));
        times.extend(
            tl.marks
                .iter()
                .flat_map(|m| [Some(m.at), m.until])
                .flatten(),
        );
    }
    let start = times.iter().copied().min().unwrap_or(0);
    let end = times.iter().copied().max().unwrap_or(start);
    let x0 = LABEL_W;
    let x1 = WIDTH - RIGHT_PAD;
    let scale = Scale::new(times, x0, x1);
    let lanes_bottom = TOP + LANE_H * timelines.len().max(1) as f64;
    let legend_y = lanes_bottom + 34.0;
    let height = legend_y + 74.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    s.push_str(concat!(
        "<style>",
        ".axis{stroke:#9aa3ad;stroke-width:1}",
        ".tick{fill:#55606b;font-size:11px}",
        ".lane-label{fill:#1f2933;font-size:13px;font-weight:bold}",
        ".lane-sub{fill:#55606b;font-size:11px}",
        ".band{stroke:#ffffff;stroke-width:0.5}",
        ".gap{fill:#f3f4f6}",
        ".gap-label{fill:#6b7280;font-size:10px}",
        ".title{fill:#111827;font-size:16px;font-weight:bold}",
        ".sub{fill:#55606b;font-size:11px}",
        "</style>\n"
    ));
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let names: Vec<&str> = timelines.iter().map(|t| t.task_id.as_str()).collect();
    let _ = writeln!(
        s,
        r#"<text class="title" x="16" y="26">taskbox timeline — {}</text>"#,
        escape(&shorten(&names.join(", "), 90))
    );
    let _ = writeln!(
        s,
        r#"<text class="sub" x="16" y="44">from {} to {} ({}); times on the axis are offsets from the start</text>"#,
        escape(&format_ms(start)),
        escape(&format_ms(end)),
        escape(&fmt_dur(end - start))
    );

    // Compressed gaps: a light stripe across every lane, with the quiet time written on it.
    for seg in scale.segs.iter().filter(|g| g.gap) {
        let _ = writeln!(
            s,
            r#"<rect class="gap" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
            seg.x0,
            TOP - 12.0,
            seg.x1 - seg.x0,
            lanes_bottom - TOP + 12.0
        );
        let mid = (seg.x0 + seg.x1) / 2.0;
        let _ = writeln!(
            s,
            r#"<text class="gap-label" x="{mid:.1}" y="{:.1}" text-anchor="middle">⋯ {} ⋯</text>"#,
            lanes_bottom + 10.0,
            escape(&fmt_dur(seg.t1 - seg.t0))
        );
    }

    // Axis and ticks.
    let _ = writeln!(
        s,
        r#"<line class="axis" x1="{x0:.1}" y1="{:.1}" x2="{x1:.1}" y2="{:.1}"/>"#,
        TOP - 8.0,
        TOP - 8.0
    );
    let step = TICK_STEPS
        .iter()
        .copied()
        .find(|st| *st as f64 * scale.k >= 90.0)
        .unwrap_or(86_400_000);
    let gap_edges: Vec<f64> = scale
        .segs
        .iter()
        .filter(|g| g.gap)
        .flat_map(|g| [g.x0, g.x1])
        .collect();
    let mut last_tick_x = f64::NEG_INFINITY;
    for seg in scale.segs.iter().filter(|g| !g.gap) {
        let first = (seg.t0 - start).div_ceil(step) * step;
        let mut off = first;
        while start + off <= seg.t1 {
            let x = scale.x(start + off);
            let clear = gap_edges.iter().all(|g| (x - g).abs() >= 30.0);
            if x - last_tick_x >= 60.0 && clear {
                let _ = writeln!(
                    s,
                    r#"<line class="axis" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    TOP - 12.0,
                    TOP - 4.0,
                    TOP - 24.0,
                    escape(&fmt_offset(off, step))
                );
                last_tick_x = x;
            }
            off += step;
        }
    }

    for (i, tl) in timelines.iter().enumerate() {
        let lane_top = TOP + LANE_H * i as f64;
        lane(&mut s, tl, &scale, lane_top, x1);
    }
    legend(&mut s, legend_y);
    s.push_str("</svg>\n");
    s
}

fn lane(s: &mut String, tl: &Timeline, scale: &Scale, top: f64, x_end: f64) {
    let band_y = top + 20.0;
    let final_state = tl.bands.last().map_or(TaskState::Idle, |b| b.state);
    let _ = writeln!(s, r#"<g class="lane" data-task="{}">"#, escape(&tl.task_id));
    let _ = writeln!(
        s,
        r#"<text class="lane-label" x="16" y="{:.1}">{}</text><text class="lane-sub" x="16" y="{:.1}">{} entries · now {}</text>"#,
        band_y + 10.0,
        escape(&shorten(&tl.task_id, 20)),
        band_y + 25.0,
        tl.rows.len(),
        final_state
    );
    let last = tl.bands.len().saturating_sub(1);
    for (j, b) in tl.bands.iter().enumerate() {
        let bx0 = scale.x(b.from);
        // The last band reaches the end of the axis: the task is still in that state.
        let bx1 = if j == last { x_end } else { scale.x(b.to) };
        let w = (bx1 - bx0).max(1.5);
        let _ = writeln!(
            s,
            r#"<rect class="band state-{st}" data-state="{st}" x="{bx0:.1}" y="{band_y:.1}" width="{w:.1}" height="{BAND_H}" fill="{fill}"><title>{st}: {} → {} ({})</title></rect>"#,
            escape(&format_ms(b.from)),
            escape(&format_ms(b.to)),
            escape(&fmt_dur(b.to - b.from)),
            st = b.state,
            fill = state_colour(b.state),
        );
        if w > 70.0 {
            // Leave room for an expiry marker drawn where the band starts.
            let marked = tl
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::Expiry && (scale.x(m.at) - bx0).abs() < 10.0);
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#1f2933" pointer-events="none">{}</text>"##,
                bx0 + if marked { 13.0 } else { 4.0 },
                band_y + 15.0,
                b.state
            );
        }
    }
    let above = band_y - 9.0;
    let below = band_y + BAND_H;
    for m in &tl.marks {
        let x = scale.x(m.at);
        let title = format!("#{} {} — {}", m.task_seq, clock_time(m.at), m.label);
        let _ = write!(
            s,
            r#"<g class="mark {k}" data-kind="{k}" data-seq="{}"><title>{}</title>"#,
            m.task_seq,
            escape(&title),
            k = m.kind.as_str()
        );
        match m.kind {
            MarkKind::Command => {
                let xe = m.until.map_or(x_end, |u| scale.x(u));
                let _ = write!(
                    s,
                    r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="7" rx="2" fill="#374151"/>"##,
                    below + 4.0,
                    (xe - x).max(3.0)
                );
            }
            MarkKind::Snapshot => {
                let _ = write!(
                    s,
                    r##"<path d="M{x:.1} {:.1} l6 6 l-6 6 l-6 -6 z" fill="#1d4ed8" stroke="#ffffff" stroke-width="1"/>"##,
                    above - 6.0
                );
            }
            MarkKind::Restore => {
                let _ = write!(
                    s,
                    r##"<path d="M{x:.1} {:.1} l7 12 l-14 0 z" fill="#0f766e" stroke="#ffffff" stroke-width="1"/>"##,
                    above - 7.0
                );
            }
            MarkKind::Expiry => {
                let cy = band_y + BAND_H / 2.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="9" fill="#ffffff" stroke="#b91c1c" stroke-width="2"/><path d="M{:.1} {:.1} l10 10 M{:.1} {:.1} l-10 10" stroke="#b91c1c" stroke-width="2.5"/>"##,
                    x - 5.0,
                    cy - 5.0,
                    x + 5.0,
                    cy - 5.0
                );
            }
            MarkKind::Fault => {
                let cy = below + 20.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="6" fill="#dc2626"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10" font-weight="bold" fill="#ffffff">!</text>"##,
                    cy + 3.5
                );
            }
            MarkKind::Retry => {
                let cy = below + 20.0;
                let _ = write!(
                    s,
                    r##"<circle cx="{x:.1}" cy="{cy:.1}" r="5" fill="none" stroke="#ea580c" stroke-width="2.5" stroke-dasharray="22 9"/>"##
                );
            }
            MarkKind::Request => {
                let _ = write!(
                    s,
                    r##"<path d="M{:.1} {:.1} l10 0 l-5 8 z" fill="#6b7280"/>"##,
                    x - 5.0,
                    above - 5.0
                );
            }
            MarkKind::Recovery => {
                let _ = write!(
                    s,
                    r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#7c3aed" stroke-width="2" stroke-dasharray="3 2"/><circle cx="{x:.1}" cy="{:.1}" r="3" fill="#7c3aed"/>"##,
                    band_y - 4.0,
                    band_y + BAND_H + 4.0,
                    band_y - 6.0
                );
            }
        }
        s.push_str("</g>\n");
    }
    s.push_str("</g>\n");
}

fn legend(s: &mut String, y: f64) {
    let _ = writeln!(s, r#"<g class="legend">"#);
    let _ = writeln!(
        s,
        r##"<text x="16" y="{:.1}" font-weight="bold" fill="#1f2933">states</text>"##,
        y + 4.0
    );
    let mut x = LABEL_W;
    for st in TaskState::ALL {
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="22" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" fill="#1f2933">{st}</text>"##,
            y - 6.0,
            state_colour(st),
            x + 28.0,
            y + 4.0
        );
        x += 120.0;
    }
    let y2 = y + 30.0;
    let _ = writeln!(
        s,
        r##"<text x="16" y="{:.1}" font-weight="bold" fill="#1f2933">markers</text>"##,
        y2 + 4.0
    );
    let mut x = LABEL_W;
    for k in MarkKind::ALL {
        let label = match k {
            MarkKind::Command => "command ran",
            MarkKind::Snapshot => "snapshot taken",
            MarkKind::Restore => "restored",
            MarkKind::Expiry => "sandbox expired",
            MarkKind::Fault => "provider fault",
            MarkKind::Retry => "retry",
            MarkKind::Request => "suspend/resume",
            MarkKind::Recovery => "restart",
        };
        let cx = x + 8.0;
        let shape = match k {
            MarkKind::Command => format!(
                r##"<rect x="{:.1}" y="{:.1}" width="18" height="7" rx="2" fill="#374151"/>"##,
                x,
                y2 - 4.0
            ),
            MarkKind::Snapshot => format!(
                r##"<path d="M{cx:.1} {:.1} l6 6 l-6 6 l-6 -6 z" fill="#1d4ed8"/>"##,
                y2 - 6.0
            ),
            MarkKind::Restore => format!(
                r##"<path d="M{cx:.1} {:.1} l7 12 l-14 0 z" fill="#0f766e"/>"##,
                y2 - 6.0
            ),
            MarkKind::Expiry => format!(
                r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="7" fill="#ffffff" stroke="#b91c1c" stroke-width="2"/><path d="M{:.1} {:.1} l8 8 M{:.1} {:.1} l-8 8" stroke="#b91c1c" stroke-width="2"/>"##,
                cx - 4.0,
                y2 - 4.0,
                cx + 4.0,
                y2 - 4.0
            ),
            MarkKind::Fault => {
                format!(r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="6" fill="#dc2626"/>"##)
            }
            MarkKind::Retry => format!(
                r##"<circle cx="{cx:.1}" cy="{y2:.1}" r="5" fill="none" stroke="#ea580c" stroke-width="2.5" stroke-dasharray="22 9"/>"##
            ),
            MarkKind::Request => format!(
                r##"<path d="M{:.1} {:.1} l10 0 l-5 8 z" fill="#6b7280"/>"##,
                cx - 5.0,
                y2 - 4.0
            ),
            MarkKind::Recovery => format!(
                r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#7c3aed" stroke-width="2" stroke-dasharray="3 2"/>"##,
                y2 - 8.0,
                y2 + 8.0
            ),
        };
        let _ = writeln!(
            s,
            r##"<g class="legend-item" data-kind="{}">{shape}<text x="{:.1}" y="{:.1}" fill="#1f2933">{label}</text></g>"##,
            k.as_str(),
            x + 24.0,
            y2 + 4.0
        );
        x += 125.0;
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_dur(850), "850 ms");
        assert_eq!(fmt_dur(4_250), "4.2 s");
        assert_eq!(fmt_dur(185_000), "3m 05s");
        assert_eq!(fmt_dur(7_380_000), "2h 03m");
        assert_eq!(fmt_dur(100_800_000), "1d 04h");
        assert_eq!(fmt_offset(1_500, 500), "+1.5s");
        assert_eq!(fmt_offset(3_350, 50), "+3.35s");
        assert_eq!(fmt_offset(4_000, 1_000), "+4s");
    }

    #[test]
    fn long_quiet_gaps_are_compressed_but_order_is_kept() {
        // Activity at 0-3 s, then nothing for an hour, then 2 s more.
        let times = vec![0, 1_000, 3_000, 3_603_000, 3_605_000];
        let sc = Scale::new(times.clone(), 100.0, 1100.0);
        let xs: Vec<f64> = times.iter().map(|&t| sc.x(t)).collect();
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{xs:?}");
        assert!((xs[3] - xs[2] - GAP_W).abs() < 0.01, "{xs:?}");
        assert!((xs[4] - 1100.0).abs() < 0.01);
        // Without a dominant gap the axis is linear.
        let lin = Scale::new(vec![0, 500, 1_000], 0.0, 100.0);
        assert!((lin.x(500) - 50.0).abs() < 0.01);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&#39;");
    }
}
