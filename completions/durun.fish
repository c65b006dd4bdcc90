# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_durun_global_optspecs
    string join \n journal= q/quiet h/help V/version
end

function __fish_durun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_durun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_durun_using_subcommand
    set -l cmd (__fish_durun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c durun -n "__fish_durun_needs_command" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_needs_command" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c durun -n "__fish_durun_needs_command" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_needs_command" -f -a "run" -d 'Run an agent command as a durable task'
complete -c durun -n "__fish_durun_needs_command" -f -a "resume" -d 'Relaunch an unfinished task, replaying the steps it finished'
complete -c durun -n "__fish_durun_needs_command" -f -a "inspect" -d 'Show tasks, or one task\'s runs and steps'
complete -c durun -n "__fish_durun_needs_command" -f -a "resolve" -d 'Settle a step in doubt by hand: run it again, or record what happened'
complete -c durun -n "__fish_durun_needs_command" -f -a "cancel" -d 'Stop a task for good: its runner ends the agent, and it never resumes'
complete -c durun -n "__fish_durun_needs_command" -f -a "gc" -d 'Delete finished tasks (completed, failed, cancelled) from the journal'
complete -c durun -n "__fish_durun_needs_command" -f -a "step" -d 'Run a command as a journaled step of the running task (shell agents)'
complete -c durun -n "__fish_durun_needs_command" -f -a "call" -d 'Call a tool from the task\'s durun.toml and print its output as JSON'
complete -c durun -n "__fish_durun_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c durun -n "__fish_durun_needs_command" -f -a "generate" -d 'Write the man page and completion scripts into a directory'
complete -c durun -n "__fish_durun_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c durun -n "__fish_durun_using_subcommand run" -l task -d 'The task\'s id [default: a new one]' -r
complete -c durun -n "__fish_durun_using_subcommand run" -l config -d 'The tools file [default: ./durun.toml if it exists]' -r -F
complete -c durun -n "__fish_durun_using_subcommand run" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand run" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c durun -n "__fish_durun_using_subcommand run" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand resume" -l from-step -d 'Discard steps N and later from replay (kept in the journal as `discarded`) and run them anew; lists the `mutate` steps among them that already took effect' -r
complete -c durun -n "__fish_durun_using_subcommand resume" -l jobs -d 'With --all: how many tasks run at once [default: 1]' -r
complete -c durun -n "__fish_durun_using_subcommand resume" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand resume" -l all -d 'Resume every interrupted task (its runner is gone), the entry point for a daemon restarted by systemd or a pool of workers'
complete -c durun -n "__fish_durun_using_subcommand resume" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand resume" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand resume" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand inspect" -l step -d 'Show one step whole: args, output, error, key and timings' -r
complete -c durun -n "__fish_durun_using_subcommand inspect" -l status -d 'List only tasks with this status' -r -f -a "running\t''
completed\t''
failed\t''
interrupted\t''
cancelled\t''"
complete -c durun -n "__fish_durun_using_subcommand inspect" -l limit -d 'List at most this many tasks' -r
complete -c durun -n "__fish_durun_using_subcommand inspect" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand inspect" -l json -d 'Print JSON for scripts (the shape is part of durun\'s contract)'
complete -c durun -n "__fish_durun_using_subcommand inspect" -l follow -d 'Print the task\'s steps as they happen, until it stops running'
complete -c durun -n "__fish_durun_using_subcommand inspect" -l all -d 'Show every step of a long task, not only the last 500'
complete -c durun -n "__fish_durun_using_subcommand inspect" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand inspect" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand inspect" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand resolve" -l output -d 'The step took effect: record this JSON as its output' -r
complete -c durun -n "__fish_durun_using_subcommand resolve" -l fail -d 'The step did not take effect: record it as failed with this message' -r
complete -c durun -n "__fish_durun_using_subcommand resolve" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand resolve" -l retry -d 'Run the step again on the next resume'
complete -c durun -n "__fish_durun_using_subcommand resolve" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand resolve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c durun -n "__fish_durun_using_subcommand resolve" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand cancel" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand cancel" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand cancel" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand cancel" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand gc" -l older-than -d 'Delete tasks finished longer ago than this, like `30d` or `12h`' -r
complete -c durun -n "__fish_durun_using_subcommand gc" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand gc" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand gc" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand gc" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand step" -l effect -d '`read` (safe to repeat) or `mutate` (changes the world)' -r -f -a "read\t''
mutate\t''"
complete -c durun -n "__fish_durun_using_subcommand step" -l args -d 'More of the step\'s identity, as a JSON object merged into its args' -r
complete -c durun -n "__fish_durun_using_subcommand step" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand step" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand step" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c durun -n "__fish_durun_using_subcommand step" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand call" -l args -d 'The tool\'s args, as JSON [default: {}]' -r
complete -c durun -n "__fish_durun_using_subcommand call" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand call" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand call" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c durun -n "__fish_durun_using_subcommand call" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand completions" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand completions" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand completions" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand completions" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand generate" -l out -d 'The directory to write `man/` and `completions/` into' -r -F
complete -c durun -n "__fish_durun_using_subcommand generate" -l journal -d 'The journal file [default: $XDG_STATE_HOME/durun/journal.db]' -r
complete -c durun -n "__fish_durun_using_subcommand generate" -s q -l quiet -d 'Print no progress on stderr'
complete -c durun -n "__fish_durun_using_subcommand generate" -s h -l help -d 'Print help'
complete -c durun -n "__fish_durun_using_subcommand generate" -s V -l version -d 'Print version'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "run" -d 'Run an agent command as a durable task'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "resume" -d 'Relaunch an unfinished task, replaying the steps it finished'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "inspect" -d 'Show tasks, or one task\'s runs and steps'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "resolve" -d 'Settle a step in doubt by hand: run it again, or record what happened'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "cancel" -d 'Stop a task for good: its runner ends the agent, and it never resumes'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "gc" -d 'Delete finished tasks (completed, failed, cancelled) from the journal'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "step" -d 'Run a command as a journaled step of the running task (shell agents)'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "call" -d 'Call a tool from the task\'s durun.toml and print its output as JSON'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "completions" -d 'Print a shell completion script'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "generate" -d 'Write the man page and completion scripts into a directory'
complete -c durun -n "__fish_durun_using_subcommand help; and not __fish_seen_subcommand_from run resume inspect resolve cancel gc step call completions generate help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
