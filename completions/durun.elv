
use builtin;
use str;

set edit:completion:arg-completer[durun] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'durun'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'durun'= {
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Run an agent command as a durable task'
            cand resume 'Relaunch an unfinished task, replaying the steps it finished'
            cand inspect 'Show tasks, or one task''s runs and steps'
            cand resolve 'Settle a step in doubt by hand: run it again, or record what happened'
            cand cancel 'Stop a task for good: its runner ends the agent, and it never resumes'
            cand gc 'Delete finished tasks (completed, failed, cancelled) from the journal'
            cand step 'Run a command as a journaled step of the running task (shell agents)'
            cand call 'Call a tool from the task''s durun.toml and print its output as JSON'
            cand completions 'Print a shell completion script'
            cand generate 'Write the man page and completion scripts into a directory'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'durun;run'= {
            cand --task 'The task''s id [default: a new one]'
            cand --config 'The tools file [default: ./durun.toml if it exists]'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;resume'= {
            cand --from-step 'Discard steps N and later from replay (kept in the journal as `discarded`) and run them anew; lists the `mutate` steps among them that already took effect'
            cand --jobs 'With --all: how many tasks run at once [default: 1]'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand --all 'Resume every interrupted task (its runner is gone), the entry point for a daemon restarted by systemd or a pool of workers'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;inspect'= {
            cand --step 'Show one step whole: args, output, error, key and timings'
            cand --status 'List only tasks with this status'
            cand --limit 'List at most this many tasks'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand --json 'Print JSON for scripts (the shape is part of durun''s contract)'
            cand --follow 'Print the task''s steps as they happen, until it stops running'
            cand --all 'Show every step of a long task, not only the last 500'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;resolve'= {
            cand --output 'The step took effect: record this JSON as its output'
            cand --fail 'The step did not take effect: record it as failed with this message'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand --retry 'Run the step again on the next resume'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;cancel'= {
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;gc'= {
            cand --older-than 'Delete tasks finished longer ago than this, like `30d` or `12h`'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;step'= {
            cand --effect '`read` (safe to repeat) or `mutate` (changes the world)'
            cand --args 'More of the step''s identity, as a JSON object merged into its args'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;call'= {
            cand --args 'The tool''s args, as JSON [default: {}]'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;completions'= {
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;generate'= {
            cand --out 'The directory to write `man/` and `completions/` into'
            cand --journal 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]'
            cand -q 'Print no progress on stderr'
            cand --quiet 'Print no progress on stderr'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'durun;help'= {
            cand run 'Run an agent command as a durable task'
            cand resume 'Relaunch an unfinished task, replaying the steps it finished'
            cand inspect 'Show tasks, or one task''s runs and steps'
            cand resolve 'Settle a step in doubt by hand: run it again, or record what happened'
            cand cancel 'Stop a task for good: its runner ends the agent, and it never resumes'
            cand gc 'Delete finished tasks (completed, failed, cancelled) from the journal'
            cand step 'Run a command as a journaled step of the running task (shell agents)'
            cand call 'Call a tool from the task''s durun.toml and print its output as JSON'
            cand completions 'Print a shell completion script'
            cand generate 'Write the man page and completion scripts into a directory'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'durun;help;run'= {
        }
        &'durun;help;resume'= {
        }
        &'durun;help;inspect'= {
        }
        &'durun;help;resolve'= {
        }
        &'durun;help;cancel'= {
        }
        &'durun;help;gc'= {
        }
        &'durun;help;step'= {
        }
        &'durun;help;call'= {
        }
        &'durun;help;completions'= {
        }
        &'durun;help;generate'= {
        }
        &'durun;help;help'= {
        }
    ]
    $completions[$command]
}
