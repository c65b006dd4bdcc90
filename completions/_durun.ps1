
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'durun' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'durun'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'durun' {
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run an agent command as a durable task')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Relaunch an unfinished task, replaying the steps it finished')
            [CompletionResult]::new('inspect', 'inspect', [CompletionResultType]::ParameterValue, 'Show tasks, or one task''s runs and steps')
            [CompletionResult]::new('resolve', 'resolve', [CompletionResultType]::ParameterValue, 'Settle a step in doubt by hand: run it again, or record what happened')
            [CompletionResult]::new('cancel', 'cancel', [CompletionResultType]::ParameterValue, 'Stop a task for good: its runner ends the agent, and it never resumes')
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete finished tasks (completed, failed, cancelled) from the journal')
            [CompletionResult]::new('step', 'step', [CompletionResultType]::ParameterValue, 'Run a command as a journaled step of the running task (shell agents)')
            [CompletionResult]::new('call', 'call', [CompletionResultType]::ParameterValue, 'Call a tool from the task''s durun.toml and print its output as JSON')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('generate', 'generate', [CompletionResultType]::ParameterValue, 'Write the man page and completion scripts into a directory')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'durun;run' {
            [CompletionResult]::new('--task', '--task', [CompletionResultType]::ParameterName, 'The task''s id [default: a new one]')
            [CompletionResult]::new('--config', '--config', [CompletionResultType]::ParameterName, 'The tools file [default: ./durun.toml if it exists]')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;resume' {
            [CompletionResult]::new('--from-step', '--from-step', [CompletionResultType]::ParameterName, 'Discard steps N and later from replay (kept in the journal as `discarded`) and run them anew; lists the `mutate` steps among them that already took effect')
            [CompletionResult]::new('--jobs', '--jobs', [CompletionResultType]::ParameterName, 'With --all: how many tasks run at once [default: 1]')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('--all', '--all', [CompletionResultType]::ParameterName, 'Resume every interrupted task (its runner is gone), the entry point for a daemon restarted by systemd or a pool of workers')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;inspect' {
            [CompletionResult]::new('--step', '--step', [CompletionResultType]::ParameterName, 'Show one step whole: args, output, error, key and timings')
            [CompletionResult]::new('--status', '--status', [CompletionResultType]::ParameterName, 'List only tasks with this status')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'List at most this many tasks')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON for scripts (the shape is part of durun''s contract)')
            [CompletionResult]::new('--follow', '--follow', [CompletionResultType]::ParameterName, 'Print the task''s steps as they happen, until it stops running')
            [CompletionResult]::new('--all', '--all', [CompletionResultType]::ParameterName, 'Show every step of a long task, not only the last 500')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;resolve' {
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'The step took effect: record this JSON as its output')
            [CompletionResult]::new('--fail', '--fail', [CompletionResultType]::ParameterName, 'The step did not take effect: record it as failed with this message')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('--retry', '--retry', [CompletionResultType]::ParameterName, 'Run the step again on the next resume')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;cancel' {
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;gc' {
            [CompletionResult]::new('--older-than', '--older-than', [CompletionResultType]::ParameterName, 'Delete tasks finished longer ago than this, like `30d` or `12h`')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;step' {
            [CompletionResult]::new('--effect', '--effect', [CompletionResultType]::ParameterName, '`read` (safe to repeat) or `mutate` (changes the world)')
            [CompletionResult]::new('--args', '--args', [CompletionResultType]::ParameterName, 'More of the step''s identity, as a JSON object merged into its args')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;call' {
            [CompletionResult]::new('--args', '--args', [CompletionResultType]::ParameterName, 'The tool''s args, as JSON [default: {}]')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;completions' {
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;generate' {
            [CompletionResult]::new('--out', '--out', [CompletionResultType]::ParameterName, 'The directory to write `man/` and `completions/` into')
            [CompletionResult]::new('--journal', '--journal', [CompletionResultType]::ParameterName, 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print no progress on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'durun;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run an agent command as a durable task')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Relaunch an unfinished task, replaying the steps it finished')
            [CompletionResult]::new('inspect', 'inspect', [CompletionResultType]::ParameterValue, 'Show tasks, or one task''s runs and steps')
            [CompletionResult]::new('resolve', 'resolve', [CompletionResultType]::ParameterValue, 'Settle a step in doubt by hand: run it again, or record what happened')
            [CompletionResult]::new('cancel', 'cancel', [CompletionResultType]::ParameterValue, 'Stop a task for good: its runner ends the agent, and it never resumes')
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete finished tasks (completed, failed, cancelled) from the journal')
            [CompletionResult]::new('step', 'step', [CompletionResultType]::ParameterValue, 'Run a command as a journaled step of the running task (shell agents)')
            [CompletionResult]::new('call', 'call', [CompletionResultType]::ParameterValue, 'Call a tool from the task''s durun.toml and print its output as JSON')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('generate', 'generate', [CompletionResultType]::ParameterValue, 'Write the man page and completion scripts into a directory')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'durun;help;run' {
            break
        }
        'durun;help;resume' {
            break
        }
        'durun;help;inspect' {
            break
        }
        'durun;help;resolve' {
            break
        }
        'durun;help;cancel' {
            break
        }
        'durun;help;gc' {
            break
        }
        'durun;help;step' {
            break
        }
        'durun;help;call' {
            break
        }
        'durun;help;completions' {
            break
        }
        'durun;help;generate' {
            break
        }
        'durun;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
