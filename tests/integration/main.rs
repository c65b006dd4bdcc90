//! durun's integration tests: the real binary, real agent processes (python3),
//! real signals, a real SQLite file, and fake LLM and API servers on loopback.

mod answers;
mod browser;
mod children;
mod cli;
mod crash;
mod crash_test;
mod env;
mod examples;
mod faults;
mod fencing;
mod http;
mod inspect;
mod journal_file;
mod keys;
mod languages;
mod lease;
mod mcp;
mod messages;
mod proxy;
mod recovery;
mod retries;
mod run;
mod schedules;
mod sdk;
mod sdk_python;
mod servers;
mod shared;
mod terminal;
mod torture;
mod traces;
mod triggers;
mod ui;
mod waiting;
mod worker_runs;
mod workers;
