#!/usr/bin/env bash
# A shell agent made durable with `durun step`: run it with
#   durun run -- bash agent.sh
# Each `durun step` runs once; after a crash, `durun resume` prints the
# recorded output of the steps that finished instead of running them.
set -euo pipefail
port=${FAKE_PORT:-8765}

usage=$(mktemp)
trap 'rm -f "$usage"' EXIT

ask() {  # a model call, as a journaled step; its token usage goes to $usage
    # The file's name goes in the environment: the command's argv is part
    # of the step's args, and a name that changes each run would change them.
    USAGE_FILE=$usage durun step llm --args "{\"prompt\": \"$1\"}" --usage-json "$usage" -- python3 -c '
import json, os, sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=json.dumps({"prompt": sys.argv[2]}).encode(), method="POST")
answer = json.loads(urllib.request.urlopen(req).read())
json.dump(answer["usage"], open(os.environ["USAGE_FILE"], "w"))
print(answer["text"])' "http://127.0.0.1:$port/llm" "$1"
}

plan=$(ask "plan the release notes")
[ "${CRASH_IN:-}" = "draft" ] && [ "$DURUN_RUN" = 1 ] && kill -9 $$
draft=$(ask "draft the release notes from: $plan")
# A side effect: the key makes a retry after a crash a no-op at the API.
durun step publish --effect mutate --args '{"version": "1.4.0"}' -- python3 -c '
import json, os, sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=json.dumps({"text": sys.argv[2]}).encode(), method="POST",
                             headers={"Idempotency-Key": os.environ["DURUN_IDEMPOTENCY_KEY"]})
print(urllib.request.urlopen(req).read().decode())' "http://127.0.0.1:$port/notify" "$draft"
echo "agent: published" >&2
