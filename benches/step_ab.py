"""Two durun builds, the same agent: the Python SDK's plain `durun.step`
loop (the agent's time per step, commits settled), alternating between
the builds round by round, so that a change to durun's step path is
measured against the build before it on the same machine, in the same
minutes.

    git worktree add /tmp/before REV
    (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release)
    cargo build --release
    python3 benches/step_ab.py /tmp/before-target/release/durun target/release/durun

Env: STEPS (2000), ROUNDS (6), EFFECTS (read,mutate), SYNCS (full,normal).
Prints, for each effect and sync mode, each build's median and the range
of AFTER/BEFORE over the rounds (each round runs both builds back to
back)."""

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDK = os.path.join(ROOT, "sdk/python")
ROUNDS = int(os.environ.get("ROUNDS", "6"))
EFFECTS = os.environ.get("EFFECTS", "read,mutate").split(",")
SYNCS = os.environ.get("SYNCS", "full,normal").split(",")
LOOP = r'''
import os, time, durun
n = int(os.environ.get("STEPS", "2000"))
effect = os.environ["EFFECT"]
started = time.perf_counter()
for i in range(n):
    durun.step("step", {"i": i}, lambda: i, effect)
durun.result({"us": (time.perf_counter() - started) / n * 1e6})
'''


def one(durun, agent, scratch, effect, sync):
    journal = os.path.join(scratch, "j.db")
    env = dict(os.environ, PYTHONPATH=SDK, EFFECT=effect, DURUN_SYNC=sync)
    subprocess.run([durun, "-q", "--journal", journal, "run", "--task", "t", "--", "python3", agent],
                   env=env, check=True, stderr=subprocess.DEVNULL)
    shown = subprocess.run([durun, "--journal", journal, "inspect", "t", "--json"],
                           capture_output=True, text=True, check=True).stdout
    for name in os.listdir(scratch):
        if name.startswith("j.db"):
            os.remove(os.path.join(scratch, name))
    return json.loads(shown)["task"]["output"]["us"]


def main():
    before, after = (os.path.abspath(path) for path in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as scratch:
        agent = os.path.join(scratch, "loop.py")
        with open(agent, "w") as f:
            f.write(LOOP)
        for effect in EFFECTS:
            for sync in SYNCS:
                times = {before: [], after: []}
                for round_ in range(ROUNDS):
                    # Which build goes first alternates, so neither always
                    # meets the disk's after-image of the other.
                    order = (before, after) if round_ % 2 == 0 else (after, before)
                    for durun in order:
                        times[durun].append(one(durun, agent, scratch, effect, sync))
                ratios = [a / b for a, b in zip(times[after], times[before])]
                print(f"{effect} {sync}: before {statistics.median(times[before]):.1f} µs, "
                      f"after {statistics.median(times[after]):.1f} µs a step; "
                      f"after/before {min(ratios):.2f}–{max(ratios):.2f} "
                      f"(median {statistics.median(ratios):.2f})", flush=True)


main()
