//! Completions and the man page, generated from the clap definition.
//!
//! `completions/` and `man/` in the repository are written by the hidden
//! `durun generate --out .`; a test regenerates them and fails when the
//! committed files are stale.

use std::path::Path;

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::{Cli, CompletionsArgs, GenerateArgs};

pub fn completions(args: &CompletionsArgs) -> i32 {
    let mut command = Cli::command();
    clap_complete::generate(
        args.shell,
        &mut command,
        "durun",
        &mut std::io::stdout().lock(),
    );
    0
}

pub fn generate(args: &GenerateArgs) -> Result<i32> {
    write_all(&args.out)?;
    Ok(0)
}

/// The shells `completions/` holds a script for.
pub const SHELLS: [Shell; 5] = [
    Shell::Bash,
    Shell::Zsh,
    Shell::Fish,
    Shell::Elvish,
    Shell::PowerShell,
];

fn write_all(out: &Path) -> Result<()> {
    let man_dir = out.join("man");
    let completions_dir = out.join("completions");
    for dir in [&man_dir, &completions_dir] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let command = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    write(&man_dir.join("durun.1"), &page)?;
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let name = format!("durun-{}", sub.get_name());
        let mut page = Vec::new();
        clap_mangen::Man::new(sub.clone().name(name.clone())).render(&mut page)?;
        write(&man_dir.join(format!("{name}.1")), &page)?;
    }
    for shell in SHELLS {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "durun", &mut script);
        let name = match shell {
            Shell::Bash => "durun.bash",
            Shell::Zsh => "_durun",
            Shell::Fish => "durun.fish",
            Shell::Elvish => "durun.elv",
            Shell::PowerShell => "_durun.ps1",
            _ => continue,
        };
        write(&completions_dir.join(name), &script)?;
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("failed to write {}", path.display()))
}
