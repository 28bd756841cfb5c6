//! The timeline as a self-contained HTML page: the SVG picture, then each task's table.

use std::fmt::Write as _;

use crate::clock::format_ms;
use crate::replay::diff::shorten;

use super::model::Timeline;
use super::summary::fmt_dur;
use super::svg::{escape, render_svg, state_colour};

/// A self-contained HTML page: the picture, then each task's table.
pub fn render_html(timelines: &[Timeline]) -> String {
    let mut s = String::new();
    let names: Vec<&str> = timelines.iter().map(|t| t.task_id.as_str()).collect();
    let _ = writeln!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>taskbox timeline — {}</title>",
        escape(&shorten(&names.join(", "), 90))
    );
    s.push_str(concat!(
        "<style>body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:16px;color:#1f2933}",
        "table{border-collapse:collapse;font-size:12px;margin-bottom:24px}",
        "th,td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:left;vertical-align:top}",
        "th{background:#f3f4f6}td.num{text-align:right;white-space:nowrap}td.t{white-space:nowrap}td.err{color:#b91c1c}",
        ".sw{display:inline-block;width:10px;height:10px;margin-right:4px}</style></head><body>\n"
    ));
    s.push_str(&render_svg(timelines));
    for tl in timelines {
        let _ = writeln!(
            s,
            "<h2>task {}</h2>\n<table><tr><th>#</th><th>time</th><th>state</th><th>in state</th><th>event</th><th>commands</th><th>snapshots</th><th>errors / retries</th></tr>",
            escape(&tl.task_id)
        );
        for r in &tl.rows {
            let state = if r.state_before == r.state_after {
                format!(
                    "<span class=\"sw\" style=\"background:{}\"></span>{}",
                    state_colour(r.state_after),
                    r.state_after
                )
            } else {
                format!(
                    "{} → <span class=\"sw\" style=\"background:{}\"></span>{}",
                    r.state_before,
                    state_colour(r.state_after),
                    r.state_after
                )
            };
            let notes = r.notes();
            let _ = writeln!(
                s,
                "<tr><td class=\"num\">{}</td><td class=\"t\">{}</td><td>{state}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
                r.task_seq,
                escape(&format_ms(r.at)),
                escape(&fmt_dur(r.in_state_ms)),
                escape(&r.event),
                escape(&r.commands.join(", ")),
                escape(&r.snapshots.join(", ")),
                escape(&notes.join("; ")),
            );
        }
        s.push_str("</table>\n");
    }
    s.push_str("</body></html>\n");
    s
}
