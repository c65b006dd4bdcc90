//! SPEC 17's inputs: what a user, an agent or a config gives that must be
//! taken as a value or refused where it is made.

use crate::env::{TestEnv, text};

#[test]
fn names_with_a_newline_or_a_control_character_are_refused_where_they_are_made() {
    let env = TestEnv::new();
    for name in ["two\nlines", "bell\u{7}", "esc\u{1b}[2J"] {
        let output = env.durun(&["mcp", "--name", name, "--", "true"]);
        assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
        assert!(text(&output.stderr).contains("invalid MCP server name"));
        let output = env.durun(&["signal", "some-task", name]);
        assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
        let stderr = text(&output.stderr);
        assert!(stderr.contains("invalid signal name"), "{stderr}");
        // The refusal is one line: the name is shown escaped.
        assert_eq!(
            stderr
                .lines()
                .filter(|line| line.starts_with("durun:"))
                .count(),
            1,
            "{stderr}"
        );
    }
}
