//! Presets (SPEC 18): what durun knows of the coding-agent CLIs people
//! run under it, found by the name of the program a task runs. A preset
//! wires the CLI to the run's proxy where the CLI does not read the base
//! URL variables every agent gets, chooses its stdin, and names the
//! request fields it changes on every call, so that a resume replays its
//! finished model calls.

use std::io::IsTerminal as _;

use crate::config::StdinMode;

/// One CLI durun knows.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Preset {
    pub(crate) name: &'static str,
    /// What it is, for `durun presets`.
    pub(crate) about: &'static str,
    /// The file names its program goes by.
    programs: &'static [&'static str],
    /// The packages that install it (npm, PyPI), as `npx` or `uvx` name
    /// them.
    packages: &'static [&'static str],
    /// The version of the CLI its test ran on.
    pub(crate) verified: &'static str,
    /// Request fields that change on every call (`[proxy] ignore`).
    pub(crate) ignore: &'static [&'static str],
    /// How it reaches the proxy beyond the variables every agent gets.
    wiring: Wiring,
}

#[derive(Debug, PartialEq, Eq)]
enum Wiring {
    /// It reads the base URL variables every agent gets.
    Variables,
    /// These variables too, each with a route's URL.
    MoreVariables(&'static [(&'static str, &'static str)]),
    /// Codex reads no variable: a model provider of its own config, given
    /// with `-c` after its program, sends its calls to the OpenAI route
    /// over HTTP (the proxy does not take WebSockets) with its own login.
    CodexProvider,
}

/// Every preset, by name.
pub(crate) const PRESETS: [Preset; 4] = [
    Preset {
        name: "claude",
        about: "Claude Code",
        programs: &["claude"],
        packages: &["@anthropic-ai/claude-code"],
        verified: "2.1.332",
        ignore: &["/metadata/user_id"],
        wiring: Wiring::Variables,
    },
    Preset {
        name: "codex",
        about: "OpenAI Codex CLI",
        programs: &["codex"],
        packages: &["@openai/codex"],
        verified: "0.171.0",
        ignore: &[
            "/prompt_cache_key",
            "/client_metadata",
            "/input/*/id",
            "/input/*/internal_chat_message_metadata_passthrough",
            // Its shell tool's output, which carries the command's wall
            // time: the same turn would read as a new request.
            "/input/*/output",
        ],
        wiring: Wiring::CodexProvider,
    },
    Preset {
        name: "aider",
        about: "aider",
        programs: &["aider"],
        packages: &["aider-chat"],
        verified: "0.86.2",
        ignore: &[],
        // litellm, under aider, reads OPENAI_API_BASE.
        wiring: Wiring::MoreVariables(&[("OPENAI_API_BASE", "openai")]),
    },
    Preset {
        name: "gemini",
        about: "Gemini CLI",
        programs: &["gemini"],
        packages: &["@google/gemini-cli"],
        verified: "0.61.0",
        // Ids it gives function calls; its shell tool's output, which
        // names the process group the command ran in; its system prompt
        // and tool list, which name its skills in the order a file search
        // found them, not always the same (glob's order); the session
        // context that opens its first message: the date, and the folder's
        // files as they were when it started (a resume sees the files the
        // run made).
        ignore: &[
            "/systemInstruction",
            "/tools",
            "/contents/0/parts/0",
            "/contents/*/parts/*/functionCall/id",
            "/contents/*/parts/*/functionResponse/id",
            "/contents/*/parts/*/functionResponse/response/output",
        ],
        wiring: Wiring::Variables,
    },
];

/// `--preset`: a preset, or none even where the program is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    Preset(&'static Preset),
    None,
}

impl Choice {
    /// `NAME` or `none`, as `--preset` and the journal spell it.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text == "none" {
            return Ok(Self::None);
        }
        named(text).map(Self::Preset).ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|preset| preset.name).collect();
            format!("no preset {text:?}: one of {}, or none", names.join(", "))
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Preset(preset) => preset.name,
            Self::None => "none",
        }
    }
}

/// The preset named `name`.
pub(crate) fn named(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|preset| preset.name == name)
}

/// The preset of the program `argv` runs, and where in `argv` that
/// program is: its own file name (`claude`, `/usr/local/bin/codex`), or
/// the package or script a launcher runs (`npx @openai/codex`, `node
/// …/gemini.js`, `uv run aider`, `uvx --from aider-chat aider`, `python
/// -m aider`).
pub(crate) fn find(argv: &[String]) -> Option<(&'static Preset, usize)> {
    let mut at = 0;
    while let Some(word) = argv.get(at) {
        let name = program_name(word);
        let launched = match name {
            // `env A=B prog`
            "env" => next_operand(argv, at + 1, |word| word.contains('=')),
            "npx" | "pnpx" | "bunx" | "uvx" | "pipx" | "node" | "bun" | "deno" | "tsx" => {
                // `pipx run`, `deno run`, `uvx --from PACKAGE`: the package
                // an option names is the program's.
                if let Some((package, after)) =
                    option_value(argv, at + 1, &["--from", "-p", "--package"])
                    && let Some(preset) = by_package(package)
                {
                    let program = next_operand(argv, after, |_| false).unwrap_or(after);
                    return Some((preset, program));
                }
                next_operand(argv, at + 1, |word| matches!(word, "run" | "exec"))
            }
            "uv" | "pnpm" | "yarn" | "npm" => {
                next_operand(argv, at + 1, |word| matches!(word, "run" | "exec" | "dlx"))
            }
            _ if name.starts_with("python") => {
                // `python -m aider`
                let (module, after) = option_value(argv, at + 1, &["-m"])?;
                return by_program(module).map(|preset| (preset, after - 1));
            }
            _ => None,
        };
        match launched {
            Some(next) => at = next,
            None => {
                let preset = by_program(name).or_else(|| by_path(word))?;
                return Some((preset, at));
            }
        }
    }
    None
}

/// What a program is called: its file name without directory, version or
/// extension (`./node_modules/.bin/codex`, `codex.js`, `claude.exe`,
/// `@openai/codex@0.171.0` as `npx` gets it).
fn program_name(word: &str) -> &str {
    let name = word.rsplit('/').next().unwrap_or(word);
    let name = match name.find('@') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    };
    [".js", ".cjs", ".mjs", ".exe", ".py"]
        .iter()
        .find_map(|extension| name.strip_suffix(extension))
        .unwrap_or(name)
}

/// Where the program after a launcher's options is (`None` when there is
/// none): the first word at or after `from` that is not an option and
/// not `skipped`.
fn next_operand(argv: &[String], from: usize, skipped: impl Fn(&str) -> bool) -> Option<usize> {
    (from..argv.len()).find(|&at| !argv[at].starts_with('-') && !skipped(&argv[at]))
}

/// The value of the first of `options` in `argv` from `from` on, up to
/// the first operand, and where the words after it start.
fn option_value<'a>(argv: &'a [String], from: usize, options: &[&str]) -> Option<(&'a str, usize)> {
    let mut at = from;
    while let Some(word) = argv.get(at) {
        if options.contains(&word.as_str()) {
            return argv.get(at + 1).map(|value| (value.as_str(), at + 2));
        }
        if let Some((option, value)) = word.split_once('=')
            && options.contains(&option)
        {
            return Some((value, at + 1));
        }
        if !word.starts_with('-') {
            break;
        }
        at += 1;
    }
    None
}

fn by_program(name: &str) -> Option<&'static Preset> {
    PRESETS
        .iter()
        .find(|preset| preset.programs.contains(&name))
}

fn by_package(spec: &str) -> Option<&'static Preset> {
    // `@scope/name@version`, `name==version`
    let name = match spec.rfind('@') {
        Some(at) if at > 0 => &spec[..at],
        _ => spec,
    };
    let name = name.split("==").next().unwrap_or(name);
    PRESETS
        .iter()
        .find(|preset| preset.packages.contains(&name))
        .or_else(|| by_program(name))
}

/// A script inside a package's folder (`node_modules/@openai/codex/bin/x.js`).
fn by_path(word: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|preset| {
        preset
            .packages
            .iter()
            .any(|package| word.contains(&format!("node_modules/{package}/")))
    })
}

/// A CLI's stdin: durun's own terminal where a person is there to type,
/// else `/dev/null`, so that it never waits on a pipe nobody writes
/// (`--stdin inherit` hands it a piped prompt).
pub(crate) fn stdin() -> StdinMode {
    if std::io::stdin().is_terminal() {
        StdinMode::Inherit
    } else {
        StdinMode::Null
    }
}

impl Preset {
    /// `argv` wired to the proxy: what goes after the program at `at`.
    /// `route_url` is a route's URL under the proxy.
    pub(crate) fn argv(
        &self,
        argv: &[String],
        at: usize,
        route_url: impl Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let mut wired = argv.to_vec();
        if self.wiring == Wiring::CodexProvider
            && let Some(url) = route_url("openai")
        {
            let provider = format!(
                "model_providers.durun={{name=\"OpenAI through durun\",base_url={url:?},\
                 wire_api=\"responses\",requires_openai_auth=true,supports_websockets=false}}"
            );
            let overrides = [
                "-c".to_owned(),
                "model_provider=\"durun\"".to_owned(),
                "-c".to_owned(),
                provider,
            ];
            let after = (at + 1).min(wired.len());
            wired.splice(after..after, overrides);
        }
        wired
    }

    /// The variables the CLI gets beyond every agent's.
    pub(crate) fn env(&self, route_url: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        match self.wiring {
            Wiring::MoreVariables(variables) => variables
                .iter()
                .filter_map(|(variable, route)| Some(((*variable).to_owned(), route_url(route)?)))
                .collect(),
            Wiring::Variables | Wiring::CodexProvider => Vec::new(),
        }
    }

    /// Adds the fields this CLI changes on every call to `ignore` (a run's
    /// proxy and `durun test`'s recorder both match with them).
    pub(crate) fn extend_ignore(&self, ignore: &mut Vec<String>) {
        ignore.extend(self.ignore.iter().map(|pointer| (*pointer).to_owned()));
    }

    /// The programs and packages it is known by.
    pub(crate) fn programs(&self) -> Vec<&'static str> {
        self.programs.iter().chain(self.packages).copied().collect()
    }

    /// How it reaches the proxy, for `durun presets`.
    pub(crate) fn wiring(&self) -> String {
        match self.wiring {
            Wiring::Variables => "the base URL variables".to_owned(),
            Wiring::MoreVariables(variables) => {
                let names: Vec<&str> = variables.iter().map(|(name, _)| *name).collect();
                format!("the base URL variables and {}", names.join(", "))
            }
            Wiring::CodexProvider => "-c model_provider (its config)".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(line: &str) -> Option<(&'static str, usize)> {
        let argv: Vec<String> = line.split(' ').map(str::to_owned).collect();
        find(&argv).map(|(preset, at)| (preset.name, at))
    }

    #[test]
    fn a_cli_is_known_by_its_program_also_behind_a_launcher() {
        assert_eq!(found("claude -p hi"), Some(("claude", 0)));
        assert_eq!(found("/usr/local/bin/codex exec hi"), Some(("codex", 0)));
        assert_eq!(
            found("./node_modules/.bin/gemini -p hi"),
            Some(("gemini", 0))
        );
        assert_eq!(
            found("npx -y @openai/codex@0.171.0 exec hi"),
            Some(("codex", 2))
        );
        assert_eq!(
            found("npx --package=@google/gemini-cli gemini"),
            Some(("gemini", 2))
        );
        assert_eq!(
            found("node /x/node_modules/@openai/codex/bin/codex.js exec"),
            Some(("codex", 1))
        );
        assert_eq!(
            found("node /x/node_modules/@anthropic-ai/claude-code/cli.js"),
            Some(("claude", 1))
        );
        assert_eq!(found("uv run aider --yes"), Some(("aider", 2)));
        assert_eq!(found("uvx --from aider-chat aider"), Some(("aider", 3)));
        assert_eq!(found("python3 -m aider --yes"), Some(("aider", 2)));
        assert_eq!(found("env A=1 claude"), Some(("claude", 2)));
        assert_eq!(found("python3 agent.py"), None);
        assert_eq!(found("npx tsx agent.ts"), None);
        assert_eq!(found("sh -c claude"), None);
        assert_eq!(found("claudette"), None);
    }

    #[test]
    fn codex_gets_a_provider_after_its_program() {
        let codex = named("codex").unwrap();
        let argv: Vec<String> = ["npx", "@openai/codex", "exec", "hi"]
            .map(str::to_owned)
            .to_vec();
        let url = |route: &str| Some(format!("http://127.0.0.1:1/s/{route}/v1"));
        let wired = codex.argv(&argv, 1, url);
        assert_eq!(
            &wired[..4],
            ["npx", "@openai/codex", "-c", "model_provider=\"durun\""]
        );
        assert!(
            wired[5].contains("base_url=\"http://127.0.0.1:1/s/openai/v1\""),
            "{}",
            wired[5]
        );
        assert_eq!(&wired[6..], ["exec", "hi"]);
        assert!(codex.env(url).is_empty());
        let aider = named("aider").unwrap();
        assert_eq!(aider.argv(&argv, 0, url), argv);
        assert_eq!(
            aider.env(url),
            [(
                "OPENAI_API_BASE".to_owned(),
                "http://127.0.0.1:1/s/openai/v1".to_owned()
            )]
        );
    }

    #[test]
    fn a_choice_is_a_preset_or_none() {
        assert_eq!(Choice::parse("none"), Ok(Choice::None));
        assert_eq!(Choice::parse("codex").unwrap().name(), "codex");
        let refused = Choice::parse("cursor").unwrap_err();
        assert!(
            refused.contains("claude, codex, aider, gemini"),
            "{refused}"
        );
    }

    #[test]
    fn every_presets_ignore_is_a_pointer_durun_takes() {
        for preset in &PRESETS {
            for pointer in preset.ignore {
                assert!(
                    crate::config::check_ignore(pointer).is_ok(),
                    "{}: {pointer}",
                    preset.name
                );
            }
        }
    }
}
