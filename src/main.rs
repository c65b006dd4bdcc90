fn main() -> std::process::ExitCode {
    // `durun __keeper`, exec'd by durun where no nursery makes keepers: keep
    // the agent it is sent.
    durun::keep_if_asked();
    // `COMPLETE=bash durun …` from a completion script: answer and exit.
    durun::complete_if_asked();
    // `run`, `resume` and `worker`: the keepers' nursery, forked now.
    durun::nurse_if_needed();
    let code = durun::run(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
