"""Two durun builds, the same proxied call: the bench's agent
(`DURUN_BENCH_AGENT=proxy`, reqwest's blocking client) making new 10 KB
chat completions through `durun run`'s model proxy to the bench's own
upstream, which answers at once; alternating between the builds round by
round, each round with a direct call beside them, so that a change to the
proxy's path is measured against the build before it in the same
minutes.

    git worktree add /tmp/before REV
    (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release)
    cargo build --release && cargo bench --bench steps --no-run
    python3 benches/proxy_ab.py /tmp/before-target/release/durun target/release/durun

Env: CALLS (1000), ROUNDS (4), SYNCS (normal,full), BYTES (10000),
BENCH (the newest target/release/deps/steps-* binary). Prints each
round's time a call over the direct call, and each build's range.

To profile one build the same way, start the upstream alone
(`DURUN_BENCH_AGENT=upstream BENCH`, which prints its port) and run the
agent under `perf` as `one` below does."""

import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = int(os.environ.get("CALLS", "1000"))
ROUNDS = int(os.environ.get("ROUNDS", "4"))
SYNCS = os.environ.get("SYNCS", "normal,full").split(",")


def bench_binary():
    given = os.environ.get("BENCH")
    if given:
        return given
    built = [path for path in glob.glob(os.path.join(ROOT, "target/release/deps/steps-*"))
             if os.access(path, os.X_OK) and not path.endswith(".d")]
    if not built:
        sys.exit("proxy_ab: no bench binary; run `cargo bench --bench steps --no-run` first")
    return max(built, key=os.path.getmtime)


def one(bench, durun, base, scratch, sync):
    """µs a call: directly (durun None), or through `durun run`'s proxy."""
    report = os.path.join(scratch, "report.json")
    env = dict(os.environ, DURUN_BENCH_AGENT="proxy", DURUN_BENCH_STEPS=str(CALLS),
               DURUN_BENCH_OUT=report)
    if durun is None:
        subprocess.run([bench], env=dict(env, DURUN_BENCH_URL=base), check=True)
    else:
        journal = os.path.join(scratch, "j.db")
        env = dict(env, OPENAI_BASE_URL=base, DURUN_SYNC=sync, DURUN_JOURNAL=journal)
        subprocess.run([durun, "-q", "run", "--task", "proxy", "--", bench], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name in os.listdir(scratch):
            if name.startswith("j.db"):
                os.remove(os.path.join(scratch, name))
    with open(report) as f:
        return json.load(f)["elapsed_ns"] / CALLS / 1000


def main():
    before, after = (os.path.abspath(path) for path in sys.argv[1:3])
    bench = bench_binary()
    upstream = subprocess.Popen([bench], env=dict(os.environ, DURUN_BENCH_AGENT="upstream",
                                                  DURUN_BENCH_BYTES=os.environ.get("BYTES", "10000")),
                                stdout=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{upstream.stdout.readline().strip()}/v1"
        with tempfile.TemporaryDirectory() as scratch:
            for sync in SYNCS:
                added = {before: [], after: []}
                for round_ in range(ROUNDS):
                    # Which build goes first alternates.
                    order = (before, after) if round_ % 2 == 0 else (after, before)
                    direct = one(bench, None, base, scratch, sync)
                    took = {durun: one(bench, durun, base, scratch, sync) for durun in order}
                    for durun in order:
                        added[durun].append(took[durun] - direct)
                    print(f"{sync} round {round_ + 1}: direct {direct:.0f} µs; added: before "
                          f"{added[before][-1]:.0f}, after {added[after][-1]:.0f} µs", flush=True)
                print(f"{sync}: added over the direct call, before {min(added[before]):.0f}–"
                      f"{max(added[before]):.0f} µs, after {min(added[after]):.0f}–"
                      f"{max(added[after]):.0f} µs", flush=True)
    finally:
        upstream.kill()


main()
