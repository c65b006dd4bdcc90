"""The bench's workflow as agent authors write it: a plain loop of
`durun.step` through the Python SDK. Each step does the peers' work (one
line appended to a side-effect file, a small JSON document as its output).
With DURUN_BENCH_WARMUP set, that many steps (named otherwise) run first,
untimed. Writes the loop's own time, settled, to DURUN_BENCH_OUT; exits with
DURUN_BENCH_EXIT, so a task left failed can be resumed (and replayed)
again."""
import json
import os
import sys
import time

import durun

steps = int(os.environ["DURUN_BENCH_STEPS"])
effect = os.environ.get("DURUN_BENCH_EFFECT", "read")
warmup = int(os.environ.get("DURUN_BENCH_WARMUP", "0"))
counter = open("counter", "a", buffering=1)


def body(i):
    counter.write(f"{os.getpid()} {i}\n")
    return {"i": i, "payload": "x" * 100}


for i in range(1, warmup + 1):
    durun.step("warm-up", {"i": i}, lambda: body(-i), effect)
started = time.perf_counter_ns()
for i in range(1, steps + 1):
    durun.step("step", {"i": i}, lambda: body(i), effect)
# Settled: until durun has answered every step, so that a backlog in
# durun is not hidden.
durun.result(None)
elapsed = time.perf_counter_ns() - started
with open(os.environ["DURUN_BENCH_OUT"], "w") as out:
    json.dump({"elapsed_ns": elapsed}, out)
sys.exit(int(os.environ.get("DURUN_BENCH_EXIT", "0")))
