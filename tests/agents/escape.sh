# Starts three processes that try to outlive their parent, each writing its
# pid to a file in the directory $1: one in a session of its own, the child
# of a double fork, and one a `node` launcher starts detached (as the codex
# package starts its native binary). durun's tests check none outlives its
# run (SPEC 17).
setsid sh -c 'sleep 600 & echo $! > "$0/setsid.$$.tmp"; mv "$0/setsid.$$.tmp" "$0/setsid.$$"; wait' "$1" &
sh -c '(sleep 601 & echo $! > "$0/fork.$$.tmp"; mv "$0/fork.$$.tmp" "$0/fork.$$") &' "$1"
node -e "const c = require('child_process').spawn('sleep', ['602'], {detached: true, stdio: 'ignore'}); require('fs').writeFileSync(process.argv[1] + '/node.' + c.pid, String(c.pid)); c.unref();" "$1"
