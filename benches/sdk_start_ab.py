"""What an agent pays to start with an SDK, for two (or more) copies of it
against each other: each run is `durun run -- python3 agent.py` (or `node
agent.mjs`) of an agent that imports the SDK, runs one step and prints
how long the import took and the first step; the copies alternate in a new
random order each round. The medians of both, and of the whole run
(durun's start and exit included).

usage: python3 benches/sdk_start_ab.py LANG SDK_A SDK_B
       (LANG: python or node; SDK_X: a directory holding the SDK, as
       sdk/python or sdk/node of a checkout; env ROUNDS=20, DURUN, the
       binary, target/release/durun by default)

Python's bytecode is compiled first for every copy (`compileall`), as pip
does at install: without it each import compiles the SDK again when
PYTHONDONTWRITEBYTECODE is set.
"""

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
lang, *sdks = sys.argv[1:]
durun = os.environ.get("DURUN", os.path.join(ROOT, "target/release/durun"))
rounds = int(os.environ.get("ROUNDS", "20"))

PYTHON = """
import os, sys, time
sys.path.insert(0, os.environ["SDK"])
t = time.perf_counter()
import durun
imported = time.perf_counter()
durun.step("one", {}, lambda: 1)
print("START", (imported - t) * 1e3, (time.perf_counter() - imported) * 1e3, file=sys.stderr)
"""

NODE = """
const t = process.hrtime.bigint();
const durun = await import(process.env.SDK + "/index.js");
const imported = process.hrtime.bigint();
await durun.step("one", {}, () => 1);
process.stderr.write(`START ${Number(imported - t) / 1e6} ${Number(process.hrtime.bigint() - imported) / 1e6}\\n`);
"""

if lang == "python":
    for sdk in sdks:
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(sdk, "durun")], check=True)
work = tempfile.mkdtemp(prefix="durun-start-ab-")
agent = os.path.join(work, "agent.py" if lang == "python" else "agent.mjs")
with open(agent, "w") as out:
    out.write(PYTHON if lang == "python" else NODE)
program = "python3" if lang == "python" else "node"
times = {sdk: {"import": [], "first step": [], "whole run": []} for sdk in sdks}
for _ in range(rounds):
    for sdk in random.sample(sdks, len(sdks)):
        journal = os.path.join(work, "journal.db")
        for leftover in (journal, journal + "-wal", journal + "-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)
        started = time.perf_counter()
        done = subprocess.run([durun, "-q", "--journal", journal, "run", "--", program, agent], cwd=work,
                              env={**os.environ, "SDK": os.path.abspath(sdk)}, capture_output=True, text=True)
        whole = (time.perf_counter() - started) * 1e3
        line = [line for line in done.stderr.splitlines() if line.startswith("START ")]
        if done.returncode != 0 or not line:
            sys.exit(f"the agent with {sdk} failed: {done.stderr}")
        _, imported, first = line[-1].split()
        times[sdk]["import"].append(float(imported))
        times[sdk]["first step"].append(float(first))
        times[sdk]["whole run"].append(whole)
for sdk in sdks:
    print(f"{sdk}: " + ", ".join(f"{what} {statistics.median(got):.1f} ms" for what, got in times[sdk].items())
          + f" (medians of {rounds})")
