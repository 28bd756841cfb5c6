//! The one integration-test binary: every test module links into it once.

// clippy.toml's clock, process and SQLite rules and the no-printing lints guard the library;
// tests observe it from outside: they run the binary, time it, wait in real time, corrupt store
// files on purpose and print what they saw.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod api_fuzz;
mod api_spec;
mod bench;
mod chaos;
mod checkpoint;
mod checkpoint_prop;
mod cli;
mod cli_fast;
mod cli_files;
mod cli_input;
mod core_step;
mod cost;
mod crash;
mod dashboard;
mod docs;
mod engine;
mod engine_metrics;
mod fake_vercel;
mod fork;
mod hermes;
mod hostile;
mod isolation;
mod layering;
mod live;
mod local_provider;
mod mcp;
mod mcp_http;
mod pg;
mod prom_text;
mod provider_contract;
mod redaction;
mod replay;
mod server;
mod sim;
mod store;
mod support;
mod vercel_client;
mod vercel_engine;
