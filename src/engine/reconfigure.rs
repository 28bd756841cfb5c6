//! A running engine takes new settings: [`Orchestrator::reconfigure`] (issue 32 item 13: `config
//! set terminal.timeout 1` on a running server changed nothing until it restarted).
//!
//! What it replaces is what the engine decides per request or per task: the settings a task
//! runs with (its command timeout, idle lifetime, deadlines, snapshots kept) and `terminal.env`.
//! A command's default timeout and variables are taken from them as it is asked for; the loop's
//! settings go to every task it creates or loads from then on, and each loaded task whose
//! settings differ gets [`Event::SettingsChanged`] — journaled like any transition, so a replay
//! sees the settings each decision was made with. What the provider, the store or the server
//! built at start is not touched here: `config::live` names those keys, which need a restart.

use tokio::sync::oneshot;
use tracing::{info, warn};

use super::api::Orchestrator;
use super::event_loop::{EventLoop, Msg};
use super::EngineError;
use crate::config::{CommandEnv, Config};
use crate::core::{Event, TaskSettings};
use crate::ids::TaskId;

impl Orchestrator {
    /// Applies `config`'s task settings and `terminal.env` from now on: to the next command's
    /// default timeout and variables, to tasks created or loaded after this, and (journaled as
    /// [`Event::SettingsChanged`]) to every loaded task. Returns once the loop has applied them.
    /// Keys that built the provider, the store or the server are not read.
    pub async fn reconfigure(&self, config: &Config) -> Result<(), EngineError> {
        let settings = {
            let running = self.settings();
            let mut next = config.task_settings();
            // The provider's properties, not the config's, and whether this engine records
            // what made each snapshot: they stay as the engine set them.
            next.record_kinds = running.record_kinds;
            super::api::with_provider_properties(&mut next, self.inner.provider.as_ref());
            next
        };
        *self.inner.env.write().expect("env lock") = config.terminal.env.clone();
        *self.inner.settings.write().expect("settings lock") = settings.clone();
        let (done, applied) = oneshot::channel();
        self.inner
            .tx
            .send(Msg::Reconfigure { settings, done })
            .map_err(|_| EngineError::Stopped)?;
        applied.await.map_err(|_| EngineError::Stopped)
    }

    /// The settings a task created now would get.
    pub fn settings(&self) -> TaskSettings {
        self.inner.settings.read().expect("settings lock").clone()
    }

    /// `terminal.env` as the engine applies it now.
    pub(super) fn command_env(&self) -> CommandEnv {
        self.inner.env.read().expect("env lock").clone()
    }
}

impl EventLoop {
    /// [`Msg::Reconfigure`]: the loop's settings become `settings`, and each loaded task whose
    /// own differ is stepped with [`Event::SettingsChanged`].
    pub(super) fn reconfigure(&mut self, settings: TaskSettings) {
        if settings == self.settings {
            return;
        }
        self.settings = settings;
        let mut stale: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.settings != self.settings)
            .map(|(id, _)| id.clone())
            .collect();
        // The journal's order must not depend on a hash map's.
        stale.sort();
        info!(tasks = stale.len(), "new settings applied");
        for id in stale {
            let settings = self.settings.clone();
            if let Err(e) = self.apply(&id, Event::SettingsChanged { settings }) {
                warn!(task = %id, error = %e, "could not apply the new settings");
            }
        }
    }
}
