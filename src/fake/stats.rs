//! Request statistics: how many requests each endpoint saw and what it answered, and how many
//! faults were injected. A benchmark reads them to count requests per command.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;

/// Counts since the server started (or since the last reset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// All API requests (admin calls are not counted).
    pub total: u64,
    /// Requests by endpoint name ([`Endpoint::name`]).
    pub requests: BTreeMap<String, u64>,
    /// Answers by endpoint name, then by status code (as a string, e.g. `"200"`).
    pub responses: BTreeMap<String, BTreeMap<String, u64>>,
    /// Faults injected.
    pub injected: Injected,
    /// API requests being answered now: counted, not yet answered (nor dropped by a client
    /// gone). A test that killed an engine waits for none before it reads what the engine's
    /// last request did — a command it asked for may start only after its caller died.
    #[serde(default)]
    pub in_flight: u64,
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    /// Random 5xx answers.
    pub errors: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// Creates whose response was lost.
    pub dropped_creates: u64,
    /// Streams or long polls cut.
    pub cut_streams: u64,
}

impl Stats {
    /// Requests to `endpoint`.
    pub fn requests_to(&self, endpoint: Endpoint) -> u64 {
        self.requests.get(endpoint.name()).copied().unwrap_or(0)
    }

    /// Answers with `status` from `endpoint`.
    pub fn responses_from(&self, endpoint: Endpoint, status: u16) -> u64 {
        self.responses
            .get(endpoint.name())
            .and_then(|by_status| by_status.get(&status.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn count_request(&mut self, endpoint: Endpoint) {
        self.total += 1;
        *self
            .requests
            .entry(endpoint.name().to_string())
            .or_default() += 1;
    }

    pub(crate) fn count_response(&mut self, endpoint: Endpoint, status: u16) {
        *self
            .responses
            .entry(endpoint.name().to_string())
            .or_default()
            .entry(status.to_string())
            .or_default() += 1;
    }
}
