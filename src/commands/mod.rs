//! One module per subcommand, each with an `exec` that returns the exit code.

pub(crate) mod cancel;
pub(crate) mod compare;
pub(crate) mod gc;
pub(crate) mod generate;
pub(crate) mod inspect;
pub(crate) mod mcp;
pub(crate) mod presets;
pub(crate) mod resolve;
pub(crate) mod resume;
pub(crate) mod run;
pub(crate) mod schedules;
mod session;
pub(crate) mod signal;
pub(crate) mod step;
pub(crate) mod submit;
pub(crate) mod transfer;
pub(crate) mod trials;
pub(crate) mod worker;
