"""A replayed step through two copies of an SDK, or two durun binaries,
against each other: a task of STEPS `read` steps is recorded once, then
resumed ROUNDS times with each copy, in a new random order each round; each
resume prints the agent's own time per replayed step. With BUSY=N, N
processes that never sleep run beside it (a loaded machine).

usage: python3 benches/sdk_replay_ab.py DURUN LANG SDK_A SDK_B
       python3 benches/sdk_replay_ab.py DURUN_A,DURUN_B LANG SDK
       (LANG: python or node; SDK_X: a directory holding the SDK, as
       sdk/python or sdk/node of a checkout; env STEPS=3000 ROUNDS=8 BUSY=0)
"""

import os
import random
import statistics
import subprocess
import sys
import tempfile

binaries, lang, *sdks = sys.argv[1:]
# Each variant is a durun binary and an SDK copy.
variants = [(durun, sdk) for durun in binaries.split(",") for sdk in sdks]
durun = variants[0][0]
steps = int(os.environ.get("STEPS", "3000"))
rounds = int(os.environ.get("ROUNDS", "8"))
busy = int(os.environ.get("BUSY", "0"))

PYTHON = """
import os, sys, time
sys.path.insert(0, os.environ["SDK"])
import durun
t = time.perf_counter()
for i in range(int(os.environ["STEPS"])):
    durun.step("s", {"i": i}, lambda: {"v": i, "text": "x" * 100})
if os.environ["DURUN_RUN"] != "1":
    print((time.perf_counter() - t) / int(os.environ["STEPS"]) * 1e6, file=sys.stderr)
sys.exit(3)
"""

NODE = """
const durun = await import(process.env.SDK + "/index.js");
const n = Number(process.env.STEPS);
const t = performance.now();
for (let i = 0; i < n; i++) await durun.step("s", { i }, () => ({ v: i, text: "x".repeat(100) }));
if (process.env.DURUN_RUN !== "1") process.stderr.write(`${(performance.now() - t) / n * 1000}\\n`);
process.exitCode = 3;
"""

work = tempfile.mkdtemp(prefix="durun-replay-ab-")
agent = os.path.join(work, "agent.py" if lang == "python" else "agent.mjs")
with open(agent, "w") as out:
    out.write(PYTHON if lang == "python" else NODE)
program = "python3" if lang == "python" else "node"
env = {**os.environ, "STEPS": str(steps), "SDK": os.path.abspath(sdks[0])}
journal = os.path.join(work, "journal.db")
subprocess.run([durun, "--journal", journal, "run", "-q", "--task", "t", "--", program, agent],
               env=env, cwd=work, stderr=subprocess.DEVNULL)

spinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(busy)]
times = {variant: [] for variant in variants}
try:
    for _ in range(rounds):
        for variant in random.sample(variants, len(variants)):
            binary, sdk = variant
            done = subprocess.run([binary, "--journal", journal, "resume", "-q", "t"], cwd=work,
                                  env={**env, "SDK": os.path.abspath(sdk)}, capture_output=True, text=True)
            times[variant].append(float(done.stderr.strip().splitlines()[-1]))
finally:
    for spinner in spinners:
        spinner.kill()
for variant in variants:
    got = sorted(times[variant])
    name = variant[1] if len(variants) == len(sdks) else f"{variant[0]} {variant[1]}"
    print(f"{name}: replay {statistics.median(got):.1f} µs a step (range {got[0]:.1f}–{got[-1]:.1f}, {len(got)} runs)")
