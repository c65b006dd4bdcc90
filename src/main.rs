fn main() -> std::process::ExitCode {
    // `durun __keeper -- AGENT…`, started by durun for each run: keep it.
    durun::keep_if_asked();
    // `COMPLETE=bash durun …` from a completion script: answer and exit.
    durun::complete_if_asked();
    // `run`, `resume` and `worker`: the keepers' nursery, forked now.
    durun::nurse_if_needed();
    let code = durun::run(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
