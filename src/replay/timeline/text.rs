//! The timeline as a plain-text table: a heading line per task, then one line per entry.

use std::fmt::Write as _;

use crate::clock::format_ms;
use crate::replay::diff::shorten;

use super::model::Timeline;
use super::summary::{clock_time, fmt_dur};

/// The table: a heading line per task, then one line per entry.
pub fn render_text(timelines: &[Timeline]) -> String {
    let mut s = String::new();
    for (i, tl) in timelines.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "task {}: {} entries, {} → {} ({})",
            tl.task_id,
            tl.rows.len(),
            format_ms(tl.start),
            format_ms(tl.end),
            fmt_dur(tl.end - tl.start)
        );
        let _ = writeln!(
            s,
            "{:>5}  {:<12}  {:<27}  {:>8}  {:<40}  {:<44}  {:<22}  ERRORS / RETRIES",
            "#", "TIME", "STATE", "IN STATE", "EVENT", "COMMANDS", "SNAPSHOTS"
        );
        let mut day = String::new();
        for r in &tl.rows {
            let date = format_ms(r.at).get(..10).unwrap_or_default().to_string();
            if date != day {
                if !day.is_empty() {
                    let _ = writeln!(s, "       ── {date} ──");
                }
                day = date;
            }
            let state = if r.state_before == r.state_after {
                r.state_after.to_string()
            } else {
                format!("{} → {}", r.state_before, r.state_after)
            };
            let commands: Vec<&str> = r
                .commands
                .iter()
                .map(String::as_str)
                .filter(|c| !c.starts_with("timer "))
                .collect();
            let timers = r.commands.len() - commands.len();
            let mut cmd_text = commands.join(", ");
            if timers > 0 {
                if !cmd_text.is_empty() {
                    cmd_text.push_str(", ");
                }
                let _ = write!(
                    cmd_text,
                    "{timers} timer{}",
                    if timers == 1 { "" } else { "s" }
                );
            }
            if cmd_text.is_empty() {
                cmd_text.push('-');
            }
            let notes = r.notes();
            let _ = writeln!(
                s,
                "{:>5}  {:<12}  {:<27}  {:>8}  {:<40}  {:<44}  {:<22}  {}",
                r.task_seq,
                clock_time(r.at),
                state,
                if r.task_seq == 1 {
                    "-".to_string()
                } else {
                    fmt_dur(r.in_state_ms)
                },
                shorten(&r.event, 40),
                shorten(&cmd_text, 44),
                shorten(&r.snapshots.join(", "), 22),
                shorten(&notes.join("; "), 120),
            );
        }
    }
    s
}
