//! A task's life as a table and as a picture, built from its journal alone.
//!
//! [`build`] turns journal entries into a [`Timeline`] per task: one [`Row`] per entry (time,
//! state change, time spent in the state, the event, the commands, snapshot ids, errors and
//! retries), the state [`Band`]s over time, and [`Mark`]s for what a person looks for first —
//! commands, snapshots, restores, expiries, faults, retries, requests, restarts.
//! [`render_text`] prints the table; [`render_svg`] draws one lane per task with coloured state
//! bands and markers (every marker carries a `<title>` tooltip and a `data-kind`), and
//! [`render_html`] wraps the picture and the tables in a page.
//!
//! Long quiet stretches (an agent away for an hour) would squeeze everything else into a few
//! pixels on a linear axis, so gaps much longer than the activity around them are drawn at a
//! fixed width with their duration written on them.
//!
//! The rooms: `model` builds the [`Timeline`]s, `summary` says how an event, a command, a
//! duration or a size reads on one line, and `text`, `svg` and `html` each render one format.

mod html;
mod model;
mod summary;
mod svg;
mod text;

pub use html::render_html;
pub use model::{build, Band, Mark, MarkKind, Row, Timeline};
pub use summary::{command_summary, event_summary, fmt_dur};
pub use svg::{escape, render_svg, state_colour};
pub use text::render_text;
