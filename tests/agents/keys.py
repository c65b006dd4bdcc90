"""Sends one `begin` per line of JSON args in argv[1] and checks each key
durun answers against the Python reference of SPEC 3.1. Writes
{"checked": N, "mismatches": [...]} to argv[2]."""
import hashlib
import json
import os
import sys

task = os.environ["DURUN_TASK_ID"]
mismatches = []
texts = open(sys.argv[1], encoding="utf-8").read().split("\n")
texts = [t for t in texts if t]
for i, text in enumerate(texts, start=1):
    sys.stdout.write('{"op":"begin","id":%d,"name":"k","args":%s}\n' % (i, text))
    sys.stdout.flush()
    response = json.loads(sys.stdin.readline())
    args = json.loads(text)
    canonical = json.dumps(args, sort_keys=True)
    expected = hashlib.sha256(f"{task}:{i}:{canonical}".encode("utf-8")).hexdigest()
    if response.get("idempotency_key") != expected:
        mismatches.append({"text": text, "canonical": canonical, "response": response})
    sys.stdout.write('{"op":"commit","id":"c%d","step":%d,"output":null}\n' % (i, response.get("step", 0)))
    sys.stdout.flush()
    sys.stdin.readline()
json.dump({"checked": len(texts), "mismatches": mismatches}, open(sys.argv[2], "w"))
