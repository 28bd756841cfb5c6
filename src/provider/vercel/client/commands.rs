//! Command endpoints: run (detached or streamed), get (optionally long-polling), logs and kill.

use reqwest::{Method, RequestBuilder};
use serde_json::Value;

use super::{VercelClient, CALL_TIMEOUT, COMMAND_LOGS, GET_COMMAND, KILL_COMMAND, RUN_COMMAND};
use crate::provider::vercel::ndjson::NdjsonStream;
use crate::provider::vercel::wire::{Command, CommandBody, RunCommand};
use crate::provider::ProviderError;

impl VercelClient {
    /// A request to `…/sessions/{session_id}/cmd` followed by `rest` (a command id, then an
    /// action).
    fn command_request(&self, method: Method, session_id: &str, rest: &[&str]) -> RequestBuilder {
        let mut path = vec!["v2", "sandboxes", "sessions", session_id, "cmd"];
        path.extend_from_slice(rest);
        self.request(method, &path)
    }

    fn command_body(cmd: &RunCommand, wait: bool) -> Value {
        let mut body = serde_json::json!({
            "command": cmd.command,
            "args": cmd.args,
            "env": cmd.env,
            "sudo": cmd.sudo,
        });
        if let Some(cwd) = &cmd.cwd {
            body["cwd"] = Value::String(cwd.clone());
        }
        if let Some(t) = cmd.timeout_ms {
            body["timeout"] = Value::from(t.max(100));
        }
        if wait {
            body["wait"] = Value::Bool(true);
            body["logs"] = Value::Bool(true);
        }
        body
    }

    /// `POST …/cmd` detached: returns the running command.
    pub async fn run_command(
        &self,
        session_id: &str,
        cmd: &RunCommand,
    ) -> Result<Command, ProviderError> {
        let rb = self
            .command_request(Method::POST, session_id, &[])
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &Self::command_body(cmd, false));
        let body: CommandBody = self.json(RUN_COMMAND, rb).await?;
        Ok(body.command)
    }

    /// `POST …/cmd` with `wait:true, logs:true`: one request that streams the command record,
    /// its output and the final record with the exit code.
    pub async fn run_command_streaming(
        &self,
        session_id: &str,
        cmd: &RunCommand,
    ) -> Result<NdjsonStream, ProviderError> {
        let rb = self.command_request(Method::POST, session_id, &[]);
        let rb = Self::body(rb, &Self::command_body(cmd, true));
        let response = self.send(RUN_COMMAND, rb).await?;
        Ok(NdjsonStream::new(response))
    }

    /// `GET …/cmd/{id}`; with `wait`, a long-poll that answers when the command has exited
    /// (no per-request timeout: the caller bounds it).
    pub async fn get_command(
        &self,
        session_id: &str,
        cmd_id: &str,
        wait: bool,
    ) -> Result<Command, ProviderError> {
        let mut rb = self.command_request(Method::GET, session_id, &[cmd_id]);
        if wait {
            rb = rb.query(&[("wait", "true")]);
        } else {
            rb = rb.timeout(CALL_TIMEOUT);
        }
        let body: CommandBody = self.json(GET_COMMAND, rb).await?;
        Ok(body.command)
    }

    /// `GET …/cmd/{id}/logs`: the command's output from the start, as NDJSON.
    pub async fn command_logs(
        &self,
        session_id: &str,
        cmd_id: &str,
    ) -> Result<NdjsonStream, ProviderError> {
        let rb = self.command_request(Method::GET, session_id, &[cmd_id, "logs"]);
        let response = self.send(COMMAND_LOGS, rb).await?;
        Ok(NdjsonStream::new(response))
    }

    /// `POST …/cmd/{id}/kill` with a numeric signal (15 = SIGTERM).
    pub async fn kill_command(
        &self,
        session_id: &str,
        cmd_id: &str,
        signal: i32,
    ) -> Result<Command, ProviderError> {
        let rb = self
            .command_request(Method::POST, session_id, &[cmd_id, "kill"])
            .timeout(CALL_TIMEOUT);
        let rb = Self::body(rb, &serde_json::json!({"signal": signal}));
        let body: CommandBody = self.json(KILL_COMMAND, rb).await?;
        Ok(body.command)
    }
}
