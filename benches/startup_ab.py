"""Start-up of two or more durun binaries, measured against each other:
`durun run -- true` and `durun step NAME -- true` inside a run, the
binaries in a new random order every round (a strict alternation puts
the checkpoint a closing run does every few runs on the same binary
every time), wall time and CPU (the children's rusage) per command.

    cargo build --release && cp target/release/durun /tmp/after
    git stash && cargo build --release && cp target/release/durun /tmp/before && git stash pop
    taskset -c 0 python3 benches/startup_ab.py /tmp/before /tmp/after

Copy every binary the same way (cp) just before a comparison. Env: N
(200 rounds), STEPS (1: also time `durun step`; 0: only `durun run`)."""

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# The agent of the `durun step` rounds: it times each binary's `durun step`
# in a random order each round, with this file's `rounds`, and writes the
# times to $OUT.
STEP_AGENT = r"""
import json, os, sys
sys.path.insert(0, os.environ["BENCHES"])
from startup_ab import rounds
bins = json.loads(os.environ["BINS"])
times = rounds(bins, int(os.environ["N"]), lambda b, i: [b, "step", f"s{i}-{bins.index(b)}", "--", "true"])
json.dump(times, open(os.environ["OUT"], "w"))
"""


def timed(command):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall * 1e3, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3


def report(what, times):
    for binary, kept in times.items():
        print(
            f"{binary}: {what}: wall median {statistics.median(kept['wall']):.2f} ms, "
            f"CPU median {statistics.median(kept['cpu']):.2f} ms"
        )


def rounds(bins, count, command):
    """Runs `command(binary, round)` for every binary, in a new random
    order each round: wall and CPU times in ms, by binary."""
    times = {b: {"wall": [], "cpu": []} for b in bins}
    for i in range(count):
        order = bins[:]
        random.shuffle(order)
        for binary in order:
            wall, cpu = timed(command(binary, i))
            times[binary]["wall"].append(wall)
            times[binary]["cpu"].append(cpu)
    return times


def main():
    bins = [os.path.abspath(path) for path in sys.argv[1:]]
    if len(bins) < 2:
        sys.exit(__doc__)
    count = int(os.environ.get("N", "200"))
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["DURUN_JOURNAL"] = os.path.join(scratch, "journal.db")
        # A journal each: an older durun refuses a journal a newer one
        # migrated.
        journals = {b: os.path.join(scratch, f"journal-{i}.db") for i, b in enumerate(bins)}
        run = lambda b, _: [b, "--journal", journals[b], "-q", "run", "--", "true"]
        for binary in bins:
            timed(run(binary, 0))
        times = rounds(bins, count, run)
        report("durun run -- true", times)
        if os.environ.get("STEPS", "1") == "1":
            agent = os.path.join(scratch, "steps.py")
            out = os.path.join(scratch, "steps.json")
            with open(agent, "w") as f:
                f.write(STEP_AGENT)
            subprocess.run(
                [bins[-1], "-q", "run", "--", sys.executable, agent],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=dict(
                    os.environ,
                    BENCHES=os.path.dirname(os.path.abspath(__file__)),
                    BINS=json.dumps(bins),
                    N=str(count),
                    OUT=out,
                ),
            )
            with open(out) as f:
                report("durun step NAME -- true", json.load(f))


if __name__ == "__main__":
    main()
