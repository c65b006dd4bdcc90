"""An SDK's plain `durun.step` loop, the agent's time per step, for one
or more copies of the SDK, runs alternating between them.

    cargo build --release
    git archive REV sdk/python | tar -x -C /tmp/before     # an earlier SDK
    python3 benches/sdk_loop.py /tmp/before/sdk/python sdk/python
    LANG_SDK=node python3 benches/sdk_loop.py /tmp/before/sdk/node sdk/node

Env: LANG_SDK (python or node), STEPS (3000), ROUNDS (5), EFFECT (read),
DURUN_SYNC (normal here unless set: the disk's noise otherwise swamps the
SDK's part)."""

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURUN = os.environ.get("DURUN_BIN", os.path.join(ROOT, "target/release/durun"))
SDKS = sys.argv[1:] or [os.path.join(ROOT, "sdk/python")]
ROUNDS = int(os.environ.get("ROUNDS", "5"))

LOOP = r'''
import os, time, durun
n = int(os.environ.get("STEPS", "3000"))
effect = os.environ.get("EFFECT", "read")
started = time.perf_counter()
for i in range(n):
    durun.step("step", {"i": i}, lambda: i, effect)
durun.result({"us": (time.perf_counter() - started) / n * 1e6})
'''

# The same loop in JavaScript; SDK is the directory holding index.js.
NODE_LOOP = r'''
const durun = await import(process.env.SDK + "/index.js");
const n = Number(process.env.STEPS ?? "3000");
const effect = process.env.EFFECT ?? "read";
const started = process.hrtime.bigint();
for (let i = 0; i < n; i++) await durun.step("step", { i }, () => i, { effect });
await durun.result({ us: Number(process.hrtime.bigint() - started) / n / 1e3 });
'''
LANG = os.environ.get("LANG_SDK", "python")


def main():
    times = {sdk: [] for sdk in SDKS}
    with tempfile.TemporaryDirectory() as scratch:
        agent = os.path.join(scratch, "loop.mjs" if LANG == "node" else "loop.py")
        with open(agent, "w") as f:
            f.write(NODE_LOOP if LANG == "node" else LOOP)
        for round_ in range(ROUNDS):
            for sdk in SDKS:
                journal = os.path.join(scratch, f"j{round_}.db")
                env = dict(os.environ, PYTHONPATH=sdk, SDK=os.path.abspath(sdk))
                env.setdefault("DURUN_SYNC", "normal")
                subprocess.run([DURUN, "-q", "--journal", journal, "run", "--task", "t", "--",
                                "node" if LANG == "node" else "python3", agent], env=env, check=True, stderr=subprocess.DEVNULL)
                shown = subprocess.run([DURUN, "--journal", journal, "inspect", "t", "--json"],
                                       capture_output=True, text=True, check=True).stdout
                times[sdk].append(json.loads(shown)["task"]["output"]["us"])
                os.remove(journal)
    for sdk, runs in times.items():
        print(f"{sdk}: median {statistics.median(runs):.1f} µs a step "
              f"(runs {min(runs):.0f}–{max(runs):.0f} µs)")


main()
