//! One module per subcommand, each with an `exec` that returns the exit code.

pub mod cancel;
pub mod gc;
pub mod generate;
pub mod inspect;
pub mod resolve;
pub mod resume;
pub mod run;
mod session;
pub mod step;
