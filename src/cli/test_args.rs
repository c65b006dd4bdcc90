//! The arguments of `durun test` (SPEC 14), with the parsers of its step
//! ranges and faults; their `///` comments are the help text.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct TestArgs {
    /// Kill points to try at each step [default: all three]
    #[arg(long, value_name = "POINT", value_delimiter = ',')]
    pub(crate) points: Vec<crate::supervisor::Point>,

    /// Only the steps N to M of the reference run (N, N-M, N-)
    #[arg(long, value_name = "N-M", value_parser = step_range)]
    pub(crate) steps: Option<(u64, u64)>,

    /// Trials run at once, each in its own scratch journal
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) jobs: u32,

    /// A shell command that prints the state of the world the agent
    /// changes; run after the reference and after each trial (with
    /// DURUN_TEST_SCRATCH set to the trial's own directory), its output
    /// must be the same each time
    #[arg(long, value_name = "CMD")]
    pub(crate) check: Option<String>,

    /// A shell command that resets the world, run before the reference
    /// and before each trial
    #[arg(long, value_name = "CMD")]
    pub(crate) setup: Option<String>,

    /// Make the model call or tool call at step STEP fail the first time
    /// each trial makes it, to test the agent's own retries: http-429,
    /// http-500, timeout, reset or truncate
    #[arg(long, value_name = "KIND@STEP", value_parser = fault_at)]
    pub(crate) fault: Vec<(super::values::FaultKind, u64)>,

    /// How long one run of a trial may take before it counts as hung
    /// [default: ten times the reference run, at least 60s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Option<std::time::Duration>,

    /// Print the result as JSON on stdout
    #[arg(long)]
    pub(crate) json: bool,

    /// Also write the result as a JUnit XML report, for CI systems
    #[arg(long, value_name = "FILE")]
    pub(crate) junit: Option<PathBuf>,

    /// Keep the scratch directory (its path is printed on stderr)
    #[arg(long)]
    pub(crate) keep: bool,

    /// The tools file [default: ./durun.toml if it exists]
    #[arg(
        long,
        env = "DURUN_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub(crate) config: Option<PathBuf>,

    /// The agent command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// `N`, `N-M` or `N-`: the steps a test tries.
fn step_range(text: &str) -> Result<(u64, u64), String> {
    let number = |part: &str| {
        part.trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("`{part}` is not a step number (1 or more)"))
    };
    let (first, last) = match text.split_once('-') {
        Some((first, "")) => (number(first)?, u64::MAX),
        Some((first, last)) => (number(first)?, number(last)?),
        None => (number(text)?, number(text)?),
    };
    if first > last {
        return Err(format!("{text} is empty: the first step is after the last"));
    }
    Ok((first, last))
}

/// `KIND@STEP`: a fault and the step it is made at.
fn fault_at(text: &str) -> Result<(super::values::FaultKind, u64), String> {
    use clap::ValueEnum as _;
    let (kind, step) = text
        .split_once('@')
        .ok_or("expected KIND@STEP, like http-429@3")?;
    let kind = super::values::FaultKind::from_str(kind, false).map_err(|_| {
        format!("unknown fault `{kind}`: http-429, http-500, timeout, reset or truncate")
    })?;
    let step = step
        .parse::<u64>()
        .ok()
        .filter(|&step| step >= 1)
        .ok_or_else(|| format!("`{step}` is not a step number"))?;
    Ok((kind, step))
}
