fn main() -> std::process::ExitCode {
    let code = durun::run(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
