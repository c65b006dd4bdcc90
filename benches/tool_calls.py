"""What a command tool's start costs: a run of CALLS `call`s (50) of a
`read` tool whose command is `true`, one at a time, timed for two or more
durun binaries in a new random order every round. Each run has a fresh
journal. Prints each binary's median wall time per run and per call, and
the difference per call to the first binary.

    cargo build --release && cp target/release/durun /tmp/after
    git stash && cargo build --release && cp target/release/durun /tmp/before && git stash pop
    python3 benches/tool_calls.py /tmp/before /tmp/after

Env: N (rounds, 30), CALLS (50)."""

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

AGENT = r"""
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"op": "call", "id": i, "tool": "nothing", "args": {"i": i}}), flush=True)
    answer = json.loads(sys.stdin.readline())
    assert answer.get("ok"), answer
print(json.dumps({"op": "result", "id": -1, "output": None}), flush=True)
sys.stdin.readline()
"""

TOOLS = """
[tools.nothing]
command = ["true"]
effect = "read"
output = "text"
"""


def main():
    bins = [os.path.abspath(path) for path in sys.argv[1:]]
    if len(bins) < 2:
        sys.exit(__doc__)
    rounds = int(os.environ.get("N", "30"))
    calls = int(os.environ.get("CALLS", "50"))
    times = {binary: [] for binary in bins}
    with tempfile.TemporaryDirectory() as scratch:
        with open(os.path.join(scratch, "agent.py"), "w") as out:
            out.write(AGENT)
        with open(os.path.join(scratch, "durun.toml"), "w") as out:
            out.write(TOOLS)
        for i in range(rounds + 2):
            order = list(bins)
            random.shuffle(order)
            for n, binary in enumerate(order):
                journal = os.path.join(scratch, f"j{i}-{n}.db")
                started = time.perf_counter()
                subprocess.run(
                    [binary, "-q", "--journal", journal, "run", "--",
                     sys.executable, "agent.py", str(calls)],
                    cwd=scratch, check=True, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
                took = time.perf_counter() - started
                # The first two rounds warm the page cache.
                if i >= 2:
                    times[binary].append(took)
                for name in os.listdir(scratch):
                    if name.startswith(f"j{i}-{n}.db"):
                        os.remove(os.path.join(scratch, name))
    first = statistics.median(times[bins[0]])
    for binary in bins:
        median = statistics.median(times[binary])
        print(f"{binary}: {median * 1000:.1f} ms a run, {median / calls * 1e6:.0f} µs a call, "
              f"{(median - first) / calls * 1e6:+.0f} µs a call against {bins[0]}")


if __name__ == "__main__":
    main()
