//! The command line. The `///` comments are the help text.

use clap::{Args, Parser, Subcommand};

mod args;
mod signal_args;
mod test_args;
mod values;

pub(crate) use args::*;
pub(crate) use signal_args::*;
pub(crate) use test_args::TestArgs;
pub(crate) use values::FaultKind;

/// Run an AI agent so that it survives a crash.
///
/// durun starts the agent as a child and journals every step it asks for
/// (over JSON lines on the agent's stdin/stdout) before the step runs. After a
/// crash, `durun resume` replays the finished steps from the journal, with no
/// LLM call and no repeated side effect, and retries the step in flight with
/// the same idempotency key.
#[derive(Parser, Debug)]
#[command(
    name = "durun",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(
    after_help = crate::exit_code::help()
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct GlobalArgs {
    /// The journal file [default: $XDG_STATE_HOME/durun/journal.db]
    #[arg(
        long,
        global = true,
        env = "DURUN_JOURNAL",
        hide_env_values = true,
        value_name = "PATH",
        help_heading = "Global options"
    )]
    pub(crate) journal: Option<String>,

    /// Print no progress on stderr
    #[arg(short, long, global = true, help_heading = "Global options")]
    pub(crate) quiet: bool,
}

#[derive(Subcommand, Debug)]
// Each subcommand's arguments are built when it is the one parsed (and
// for help, completions and man pages): building all of them cost every
// start a tenth of `durun run -- true`'s instructions.
#[command(defer = true)]
pub(crate) enum Command {
    /// Run an agent command as a durable task
    ///
    /// Prints the task id on stderr first. With `--task ID` of a task that
    /// exists, resumes it if it did not finish and exits 0 if it completed, so
    /// a retried CI job picks up where the failed one stopped.
    #[command(after_help = "Examples:
  durun run -- python3 agent.py
  durun run --task \"release-$CI_PIPELINE_ID\" -- ./agent.sh --target prod
  DURUN_SYNC=normal durun run -- python3 agent.py   (faster steps, not power-cut safe)")]
    Run(RunArgs),
    /// Relaunch an unfinished task, replaying the steps it finished
    Resume(ResumeArgs),
    /// Crash-test an agent: kill durun at every step, resume, compare
    ///
    /// Runs the agent once as a reference, then once per step and kill
    /// point (before, during, after the step), each time killing durun
    /// with SIGKILL there and resuming until the task ends, and checks that
    /// each trial ends as the reference did, sends no finished model call
    /// again and gives each mutate step one idempotency key. Everything
    /// runs in a scratch journal; model calls in trials are answered from
    /// the reference's, tools run for real. Exits 0 when every trial
    /// holds, 1 when one does not.
    #[command(after_help = "Examples:
  durun test -- python3 agent.py
  durun test --jobs 4 --points during --steps 3-5 -- python3 agent.py
  durun test --setup 'rm -f issues.db' --check 'sqlite3 issues.db \"select * from issues\"' -- python3 agent.py
  durun test --fault http-429@2 --junit durun-test.xml -- python3 agent.py")]
    Test(TestArgs),
    /// Show tasks, or one task's runs and steps
    Inspect(InspectArgs),
    /// Compare two tasks step by step: where they part, and what changed
    ///
    /// Aligns the two tasks' steps by position and name, and shows each
    /// step that differs with the fields of its args and output that
    /// changed, as JSON pointers with the old and new values (a model call's
    /// answer as its text), then the difference in tokens and cost. For a
    /// task and its fork, or two runs of one agent. Exits 0 either way.
    #[command(after_help = "Examples:
  durun diff nightly-0412 nightly-0413
  durun diff release-1.4 release-1.4-fork --json | jq .first_parting")]
    Diff(DiffArgs),
    /// Settle a step in doubt by hand: run it again, or record what happened
    ///
    /// A step is in doubt when a run died while its side effect was under
    /// way. Every resolution is kept in the journal.
    #[command(after_help = "Examples:
  durun resolve t42 4 --retry                      the API never saw it: run it again
  durun resolve t42 4 --output '{\"url\": \"...\"}'    it happened: this is what it returned
  durun resolve t42 4 --fail 'declined by hand'    it must not happen: record a failure")]
    Resolve(ResolveArgs),
    /// Stop a task for good: its runner ends the agent, and it never resumes
    Cancel(CancelArgs),
    /// Delete finished tasks (completed, failed, cancelled) from the journal
    Gc(GcArgs),
    /// Run a command as a journaled step of the running task (shell agents)
    ///
    /// Inside `durun run`, a step the journal already holds is not run
    /// again: its recorded stdout is printed and its exit code returned.
    /// Otherwise CMD runs with DURUN_IDEMPOTENCY_KEY, DURUN_STEP and
    /// DURUN_ATTEMPT set, its stdout is recorded as it passes through, and
    /// `durun step` exits with its code. Outside a run CMD simply runs.
    #[command(
        after_help = "Example, in a script run by `durun run -- bash deploy.sh`:
  plan=$(durun step plan -- ./ask-llm.sh \"plan the release\")
  durun step tag --effect mutate --args '{\"version\": \"1.4.0\"}' -- git push origin v1.4.0"
    )]
    Step(StepArgs),
    /// Call a tool from the task's durun.toml and print its output as JSON
    ///
    /// Exits 0 with the output on stdout, or 1 with the error on stderr.
    /// Outside `durun run` the tool from ./durun.toml (or DURUN_CONFIG) runs
    /// once, journaled nowhere, so a script works with or without durun.
    Call(CallArgs),
    /// Put durun in front of an MCP server: its tool calls become steps of the run
    ///
    /// An MCP server on stdin/stdout (the stdio transport) that starts CMD
    /// as the real server, or talks to URL (streamable HTTP), and relays
    /// every message both ways. Inside `durun run` (found from
    /// DURUN_SOCKET, else from the processes above it), each `tools/call`
    /// is a step named `mcp NAME/TOOL`: replayed on resume, and journaled
    /// before it is forwarded when the tool is not read-only, with its
    /// idempotency key in `params._meta["io.durun/idempotency-key"]`.
    /// Outside a run it only relays.
    #[command(after_help = "Example, in an MCP client's config:
  \"command\": \"durun\", \"args\": [\"mcp\", \"--\", \"npx\", \"-y\", \"@modelcontextprotocol/server-memory\"]")]
    Mcp(McpArgs),
    /// Serve the journal to a coding agent over MCP: list, inspect, diff, resume, fork, approve
    ///
    /// An MCP server on stdin/stdout (the stdio transport) over the journal,
    /// for an agent that looks after durable runs. Its tools (list_tasks,
    /// inspect_task, inspect_step, diff, resume, fork, approve, signal,
    /// cancel, test) do what the commands of those names do, on the same
    /// journal, and answer what the command prints with `--json`, as text
    /// and as structured content. `durun skill install` writes the skill
    /// that tells an agent when to use them.
    #[command(after_help = "Example, Claude Code's .mcp.json:
  {\"mcpServers\": {\"durun\": {\"command\": \"durun\", \"args\": [\"mcp-server\"]}}}")]
    McpServer(McpServerArgs),
    /// Write the skill that tells a coding agent how to run, crash-test and inspect agents with durun
    #[command(after_help = "Examples:
  durun skill install                              .claude/skills/durun/SKILL.md, for Claude Code in this project
  durun skill install --dir ~/.claude/skills/durun   for every project")]
    Skill(SkillArgs),
    /// Wait for a signal, as a journaled step of the running task (shell agents)
    ///
    /// Prints the signal as JSON on stdout: {"signal", "data", "by", "at"}.
    /// A recorded wait prints its recorded signal at once. Works inside
    /// `durun run` only.
    #[command(
        after_help = "Example, in a script run by `durun run -- bash deploy.sh`:
  answer=$(durun wait approve-deploy --data \"$(cat plan.json)\" --timeout 48h)
  [ \"$(echo \"$answer\" | jq .data.approved)\" = true ] || exit 1"
    )]
    Wait(WaitArgs),
    /// Sleep durably, as a journaled step of the running task (shell agents)
    ///
    /// The wake time is fixed the first time the step runs: a resumed task
    /// sleeps only what is left. A long sleep parks the task (exit 77).
    /// Outside `durun run` it simply sleeps.
    Sleep(SleepArgs),
    /// Send a signal to a task: a live runner takes it at once, a parked task on resume
    #[command(after_help = "Examples:
  durun signal t42 ci-passed --data '{\"sha\": \"4f2a9c1\"}'
  durun signal t42 webhook --id \"$DELIVERY_ID\" --data @payload.json   (the same --id twice is kept once)")]
    Signal(SignalArgs),
    /// Approve what a task waits for: a signal to its waiting step, {"approved": true}
    Approve(ApproveArgs),
    /// Turn down what a task waits for: a signal to its waiting step, {"approved": false}
    Reject(RejectArgs),
    /// Write a task, every row of it, as JSON lines (to move it to another journal)
    #[command(
        after_help = "Example, a CI job that failed hands its task to the retry:
  durun export \"$TASK\" -o durun-task.jsonl      (upload as an artifact)
  durun import durun-task.jsonl && durun resume \"$TASK\"   (in the retried job)"
    )]
    Export(ExportArgs),
    /// Load a task written by `durun export` into this journal
    Import(ImportArgs),
    /// Copy a task's steps before step N into a new task that runs from step N
    ///
    /// The new task has the same command, directory and config; its first
    /// N-1 steps replay from the copy, the rest run anew. The original is
    /// not changed (unlike `resume --from-step`). Prints the new id.
    Fork(ForkArgs),
    /// Queue a task for a worker to run; prints its id on stdout
    #[command(after_help = "Examples:
  durun submit -- python3 agent.py --repo acme/web
  id=$(durun submit --queue nightly --task \"digest-$(date +%F)\" -- ./digest.sh)")]
    Submit(SubmitArgs),
    /// Run queued tasks, and interrupted, signalled and woken ones, until SIGTERM
    ///
    /// Claims tasks of its queues, N at a time, and runs each as `durun
    /// resume` would, in the task's recorded directory. Any number of
    /// workers on any number of hosts share one PostgreSQL journal; each
    /// task goes to one of them. On SIGTERM or SIGINT it stops claiming,
    /// stops its tasks resumably (another worker takes them over) and exits 0.
    #[command(after_help = "Examples:
  durun --journal postgres://durun@db/durun worker --jobs 4
  durun worker --queue nightly --queue default --config workers.toml   ([queues.nightly] concurrency = 2)")]
    Worker(WorkerArgs),
    /// List the schedules of durun.toml with their next tick and last task
    ///
    /// Workers started with that file submit one task per tick (id
    /// NAME-YYYYMMDDTHHMMSSZ, the tick in UTC), however many of them share
    /// the journal.
    #[command(
        after_help = "Example durun.toml, for `durun worker --config durun.toml`:
  [schedules.digest]
  cron = \"0 7 * * 1-5\"        # or: every = \"10m\"
  command = [\"python3\", \"digest.py\"]
  catch_up = \"latest\"         # of the ticks missed while no worker ran: latest, none or all"
    )]
    Schedules(SchedulesArgs),
    /// List the coding-agent CLIs durun knows, with the versions they were tried on
    ///
    /// durun knows a CLI by the program a task runs (also behind npx, node
    /// or uv run). Its preset points the CLI at durun's proxy where the
    /// base URL variables do not, gives it durun's terminal as stdin (else
    /// /dev/null, so that it never waits on a pipe), and leaves out of the
    /// call's identity the request fields it changes on every call, so
    /// that a resume replays its finished model calls. `durun run
    /// --preset NAME|none` chooses another or none.
    #[command(after_help = "Examples:
  durun run -- claude -p \"fix the failing test\"
  durun run -- npx @openai/codex exec \"update the changelog\"
  durun run --preset none -- ./my-claude-wrapper.sh")]
    Presets(PresetsArgs),
    /// Serve a web view of the journal: tasks, timelines, tokens, actions
    ///
    /// Prints the page's URL, with the token every request must carry, on
    /// stdout, and serves until SIGINT or SIGTERM. The page reads the same
    /// journal as `inspect` (SQLite or PostgreSQL) and updates itself while
    /// a run goes on; its buttons do what `approve`, `reject`, `signal`,
    /// `cancel`, `resolve` and `fork` do. Every asset is in the binary.
    #[command(after_help = "Examples:
  durun ui                                         http://127.0.0.1:7878/?token=…
  durun ui --listen 127.0.0.1:0 --open             a free port, in the desktop's browser
  durun --journal postgres://db/durun ui --listen 0.0.0.0:7878 --token-file /run/secrets/durun-ui")]
    Ui(UiArgs),
    /// Print a shell completion script
    Completions(CompletionsArgs),
    /// Write the man page and completion scripts into a directory
    #[command(hide = true)]
    Generate(GenerateArgs),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_command_lines() {
        let parse = |line: &str| Cli::try_parse_from(line.split_whitespace());
        let cases: &[(&str, bool)] = &[
            ("durun run -- python3 agent.py", true),
            ("durun run python3 -u agent.py --flag", true),
            ("durun run --task t1 --config d.toml -- ./agent", true),
            ("durun -q --journal /tmp/j.db run -- true", true),
            ("durun run --journal /tmp/j.db -- true", true),
            ("durun run", false),
            ("durun resume t1", true),
            ("durun resume", false),
            ("durun resume t1 --from-step 3", true),
            ("durun resume t1 --from-step 0", false),
            ("durun resume --all", true),
            ("durun resume --all --jobs 4", true),
            ("durun resume t1 --all", false),
            ("durun resolve t1 4 --retry", true),
            ("durun resolve t1 4 --output {}", true),
            ("durun resolve t1 4 --fail gone", true),
            ("durun resolve t1 4", false),
            ("durun resolve t1 4 --retry --fail x", false),
            ("durun cancel t1", true),
            ("durun gc --older-than 30d", true),
            ("durun gc --older-than soon", false),
            ("durun gc", false),
            ("durun inspect", true),
            ("durun inspect t1 --json", true),
            ("durun inspect t1 --step 3", true),
            ("durun inspect --step 3", false),
            ("durun inspect t1 --follow", true),
            ("durun inspect t1 --follow --json", true),
            ("durun inspect --status failed --limit 5", true),
            ("durun inspect t1 --status failed", false),
            ("durun inspect --status bogus", false),
            ("durun completions zsh", true),
            ("durun step build -- make all", true),
            ("durun step build --effect mutate --args {} -- make", true),
            ("durun step build --effect write -- make", false),
            ("durun step build", false),
            ("durun call create_pr --args {}", true),
            ("durun call", false),
            ("durun completions tcsh", false),
            ("durun wait approve", true),
            ("durun wait approve --data {} --timeout 48h", true),
            ("durun sleep 90s", true),
            ("durun sleep --until 2026-12-01T09:00:00Z", true),
            ("durun sleep", false),
            ("durun sleep soon", false),
            ("durun signal t1 go --data 1 --id a", true),
            ("durun signal t1", false),
            ("durun approve t1", true),
            ("durun reject t1 --reason no", true),
            ("durun export t1 -o f.jsonl", true),
            ("durun import f.jsonl --task t2 --replace", true),
            ("durun fork t1 --from-step 3", true),
            ("durun fork t1 --from-step 3 --task t2", true),
            ("durun fork t1", false),
            ("durun run --max-tokens 1000 --park-after 0s -- true", true),
            ("durun submit -- python3 agent.py", true),
            (
                "durun submit --queue q --task t1 --max-tokens 5 -- ./a",
                true,
            ),
            ("durun submit", false),
            ("durun worker", true),
            ("durun worker --queue a --queue b --jobs 4", true),
            ("durun worker --jobs 0", false),
            ("durun inspect --workers", true),
            ("durun inspect t1 --workers", false),
            ("durun resume t1 --max-tokens 5000", true),
            ("durun schedules", true),
            ("durun schedules --config d.toml --json", true),
            ("durun ui", true),
            ("durun ui --listen 0.0.0.0:80 --token-file t --open", true),
            ("durun ui --listen nowhere", false),
            ("durun frobnicate", false),
        ];
        for (line, ok) in cases {
            assert_eq!(parse(line).is_ok(), *ok, "{line}");
        }
        let Ok(Cli {
            command: Command::Run(run),
            ..
        }) = parse("durun run python3 -u agent.py --task x")
        else {
            panic!("run parses");
        };
        assert_eq!(
            run.new.command,
            ["python3", "-u", "agent.py", "--task", "x"]
        );
        assert_eq!(run.new.task, None);
    }
}
