//! The one integration-test binary: every test module links into it once.

mod bench;
mod chaos;
mod cli;
mod core_step;
mod crash;
mod engine;
mod fake_vercel;
mod local_provider;
mod replay;
mod sim;
mod store;
mod support;
mod vercel_client;
mod vercel_engine;
