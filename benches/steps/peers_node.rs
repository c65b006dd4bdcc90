//! The peers in JavaScript, beside the Node SDK: LangGraph.js with its
//! SQLite checkpointer and DBOS Transact for TypeScript (PostgreSQL: it
//! has no SQLite journal), installed by the bench with npm on first use.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::Table;

/// What the bench installs, pinned.
const PACKAGES: &[&str] = &[
    "@langchain/langgraph@1.7.3",
    "@langchain/langgraph-checkpoint-sqlite@1.0.4",
    "@langchain/core@1",
    // 12, not 13: 13 needs Node 22.
    "better-sqlite3@12",
    "@dbos-inc/dbos-sdk@5.3.0",
];

/// The PostgreSQL database DBOS's runs use, dropped before each.
const DBOS_DATABASE: &str = "durun_bench_dbos";

pub(crate) struct NodePeers {
    work: PathBuf,
    postgres: Option<String>,
}

impl NodePeers {
    pub(crate) fn find() -> Option<Self> {
        if std::env::var("DURUN_BENCH_PEERS").as_deref() == Ok("0") {
            return None;
        }
        let work = std::env::var_os("PEERS_NODE_WORK")
            .map_or_else(|| PathBuf::from("/tmp/durun-peers-node"), PathBuf::from);
        let installed = PACKAGES.iter().all(|package| {
            let name = package.rsplit_once('@').map_or(*package, |(name, _)| name);
            work.join("node_modules")
                .join(name)
                .join("package.json")
                .exists()
        });
        if !installed {
            eprintln!(
                "installing LangGraph.js and DBOS for TypeScript into {}",
                work.display()
            );
            let _ = std::fs::create_dir_all(&work);
            let _ = std::fs::write(
                work.join("package.json"),
                r#"{"name":"durun-bench-peers","private":true,"type":"module"}"#,
            );
            let made = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .args(PACKAGES)
                .current_dir(&work)
                // Its report on stderr: stdout is the bench's tables.
                .stdout(std::io::stderr())
                .status()
                .is_ok_and(|status| status.success());
            if !made {
                eprintln!("could not install the Node peers: their rows are left out");
                return None;
            }
        }
        let postgres = std::env::var("DURUN_BENCH_POSTGRES")
            .ok()
            .or_else(|| Some("postgresql://postgres@127.0.0.1:5432".to_owned()))
            .filter(|url| {
                let up = psql(url, "SELECT 1");
                if !up {
                    eprintln!("no PostgreSQL at {url} (DURUN_BENCH_POSTGRES): the DBOS for TypeScript row is left out");
                }
                up
            });
        Some(Self { work, postgres })
    }

    fn script(&self, name: &str, args: &[&str]) -> Option<f64> {
        // Copied beside the packages: an ES module finds them only in a
        // `node_modules` above it.
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("benches/peers_node")
            .join(name);
        let script = self.work.join(name);
        std::fs::copy(&source, &script).ok()?;
        let output = Command::new("node")
            .arg(script)
            .args(args)
            .current_dir(&self.work)
            .stderr(Stdio::piped())
            .output()
            .ok()?;
        let line = String::from_utf8_lossy(&output.stdout);
        let result: Option<Value> = line
            .lines()
            .last()
            .and_then(|last| serde_json::from_str(last).ok());
        match result {
            Some(result) if output.status.success() && result["ok"] == true => {
                result["us_per_step"].as_f64()
            }
            _ => {
                eprintln!(
                    "{name} {args:?} failed: {line}{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                None
            }
        }
    }

    pub(crate) fn first_runs(&self, root: &Path, steps: u64, table: &mut Table) {
        let steps = steps.to_string();
        let db = root.join("peer-node").join("lg.sqlite");
        let _ = std::fs::create_dir_all(root.join("peer-node"));
        let db = db.to_string_lossy();
        for (row, extra) in [
            ("LangGraph.js full", &[][..]),
            ("LangGraph.js normal", &["--synchronous", "normal"][..]),
        ] {
            let mut args = vec!["--steps", &steps, "--db", &db];
            args.extend(extra);
            if let Some(us) = self.script("langgraph_steps.mjs", &args) {
                table.add(row, us);
            }
        }
        if let Some(server) = &self.postgres {
            psql(
                server,
                &format!("DROP DATABASE IF EXISTS {DBOS_DATABASE} WITH (FORCE)"),
            );
            let url = format!("{server}/{DBOS_DATABASE}");
            let counter = root.join("peer-node").join("dbos.counter");
            let counter = counter.to_string_lossy();
            if let Some(us) = self.script(
                "dbos_steps.mjs",
                &["--steps", &steps, "--url", &url, "--counter", &counter],
            ) {
                table.add("DBOS-TS full", us);
            }
        }
    }
}

/// Runs one statement on the server's `postgres` database.
fn psql(server: &str, sql: &str) -> bool {
    Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-q", "-c", sql])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
