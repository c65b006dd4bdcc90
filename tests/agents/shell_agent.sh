#!/usr/bin/env bash
# The 8-step agent of the crash test, as a shell script with `durun step`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
echo $$ > "$AGENT_PIDFILE.tmp" && mv "$AGENT_PIDFILE.tmp" "$AGENT_PIDFILE"
llm() { durun step "llm" --args "{\"prompt\": \"$1\"}" -- python3 "$here/llm_cli.py" "$1"; }
create() { durun step "create" --effect mutate --args "{\"title\": \"$1\"}" -- python3 "$here/api_cli.py" "$1"; }
plan=$(llm "plan the change")
research=$(llm "research the code")
patch=$(llm "write the patch")
pr=$(create "Fix typo")
note=$(durun step read_note -- cat note.txt)
count=$(durun step count --args '{"n": 6}' -- sh -c 'echo 42')
summary=$(llm "summarize")
notify=$(create "Notify")
printf '%s\n' "$plan" "$research" "$patch" "$pr" "$note" "$count" "$summary" "$notify" > outputs.txt
