"""A `mutate` tool for the tests of `durun test`: creates a resource (a
line in $DURUN_TEST_SCRATCH/resources.jsonl, the world `--check` prints),
once per idempotency key unless NO_DEDUPE is set, then takes 0.4 s (where
a `during` trial kills durun)."""

import json
import os
import sys
import time

args = json.load(sys.stdin)
key = os.environ["DURUN_IDEMPOTENCY_KEY"]
path = os.path.join(os.environ.get("DURUN_TEST_SCRATCH", "."), "resources.jsonl")
made = []
if os.path.exists(path):
    with open(path) as existing:
        made = [json.loads(line) for line in existing]
found = [resource for resource in made if resource["key"] == key]
if found and not os.environ.get("NO_DEDUPE"):
    resource = found[0]
else:
    resource = {"id": f"res-{len(made) + 1}", "key": key, "title": args["title"]}
    with open(path, "a") as out:
        out.write(json.dumps(resource) + "\n")
time.sleep(0.4)
print(json.dumps({"id": resource["id"]}))
