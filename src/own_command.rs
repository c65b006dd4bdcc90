//! Runs a command of this durun binary on the same journal, as the web
//! view's buttons and `durun mcp-server`'s tools do: what they do is what
//! the command does, and what they say is what it prints.

use std::path::Path;

use crate::settings::Settings;

/// What a `durun` command said: whether it succeeded, its `durun:` lines
/// (without the prefix), and what it printed on stdout.
pub(crate) struct Said {
    pub(crate) ok: bool,
    pub(crate) message: String,
    pub(crate) printed: String,
}

/// Runs this `durun` binary with `args` on `settings`' journal, in `cwd`
/// (this process's directory if `None`), with no stdin.
pub(crate) fn durun(settings: &Settings, args: &[String], cwd: Option<&Path>) -> Said {
    let failed = |message: String| Said {
        ok: false,
        message,
        printed: String::new(),
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => return failed(format!("cannot find the durun binary: {err}")),
    };
    let mut command = std::process::Command::new(exe);
    if let Some(journal) = settings.journal_arg() {
        command.arg("--journal").arg(journal);
    }
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    match command
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(output) => Said {
            ok: output.status.success(),
            message: String::from_utf8_lossy(&output.stderr)
                .lines()
                .map(|line| line.strip_prefix("durun: ").unwrap_or(line))
                .collect::<Vec<_>>()
                .join("\n"),
            printed: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        },
        Err(err) => failed(format!(
            "cannot run durun {}: {err}",
            args.first().map_or("", String::as_str)
        )),
    }
}

/// A private file holding an edited answer for `fork --output`, removed
/// when dropped, however the fork went.
pub(crate) struct EditFile(std::path::PathBuf);

impl EditFile {
    pub(crate) fn new(output: &str) -> std::io::Result<Self> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = std::env::temp_dir().join(format!(
            "durun-edit-{}-{}",
            std::process::id(),
            crate::task::new_task_id()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let edit = Self(path);
        file.write_all(output.as_bytes())?;
        Ok(edit)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for EditFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
