//! the core's transition table (being written)
use super::*;
/// A transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub next: Task,
    pub commands: Vec<Command>,
}
/// Step error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x")]
pub struct StepError;
/// step
pub fn step(task: &Task, _e: Event, _now: Millis) -> Result<Transition, StepError> {
    Ok(Transition {
        next: task.clone(),
        commands: vec![],
    })
}
