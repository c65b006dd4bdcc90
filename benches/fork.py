"""How fast a fork gets to its first live step (SPEC 20): a task of STEPS
(200) steps, forked at its last step with an edited output (`durun fork
--at N --output FILE`), then resumed. The time runs from the start of the
fork command to the moment the agent opens the first step after the edit
that runs live (steps 1 to N-1 replay, N answers with the edit). Three
rounds a journal, on SQLite and, with DURUN_BENCH_POSTGRES (a URL), on
PostgreSQL too.

    cargo build --release
    python3 benches/fork.py target/release/durun
    DURUN_BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432/test python3 benches/fork.py target/release/durun

Env: STEPS (200), ROUNDS (3)."""

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

# An agent of STEPS `read` steps and one more, over the protocol: it writes
# the time it opens the first step durun asks it to run after a replayed
# one to $LIVE, and ends there (that step is what the fork reaches).
AGENT = r"""
import json, os, sys, time
steps = int(os.environ["STEPS"])
replayed_any = False
def ask(message, n=[0]):
    n[0] += 1
    message["id"] = n[0]
    print(json.dumps(message), flush=True)
    return json.loads(sys.stdin.readline())
for i in range(1, steps + 2):
    opened = ask({"op": "begin", "name": f"s{i}", "args": {"i": i}, "effect": "read"})
    if opened.get("replayed"):
        replayed_any = True
        continue
    if replayed_any and "LIVE" in os.environ:
        with open(os.environ["LIVE"], "w") as out:
            out.write(repr(time.time()))
        break
    ask({"op": "commit", "step": opened["step"], "output": {"i": i}})
ask({"op": "result", "output": None})
"""


def durun(binary, journal, *args, env=None):
    return subprocess.run([binary, "--journal", journal, "-q", *args], env=env, check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rounds(binary, journal, steps, count, work):
    agent = os.path.join(work, "agent.py")
    with open(agent, "w") as out:
        out.write(AGENT)
    edit = os.path.join(work, "edit.json")
    with open(edit, "w") as out:
        out.write('{"edited": true}')
    env = dict(os.environ, STEPS=str(steps))
    task = f"bench-{uuid.uuid4().hex[:8]}"
    durun(binary, journal, "run", "--task", task, "--", sys.executable, agent, env=env)
    times = []
    for round_ in range(count):
        live = os.path.join(work, f"live-{round_}")
        fork = f"{task}-f{round_}"
        started = time.time()
        durun(binary, journal, "fork", task, "--at", str(steps), "--output", edit, "--task", fork)
        durun(binary, journal, "resume", fork, env=dict(env, LIVE=live))
        with open(live) as text:
            times.append(float(text.read()) - started)
    return times


def main():
    binary = os.path.abspath(sys.argv[1])
    steps = int(os.environ.get("STEPS", "200"))
    count = int(os.environ.get("ROUNDS", "3"))
    with tempfile.TemporaryDirectory() as work:
        journals = [("SQLite", os.path.join(work, "journal.db"))]
        if os.environ.get("DURUN_BENCH_POSTGRES"):
            url = os.environ["DURUN_BENCH_POSTGRES"]
            schema = f"durun_fork_bench_{os.getpid()}"
            subprocess.run(["psql", url, "-qc", f"CREATE SCHEMA {schema}"], check=True)
            separator = "&" if "?" in url else "?"
            journals.append(("PostgreSQL", f"{url}{separator}options=-c%20search_path%3D{schema}"))
        try:
            for name, journal in journals:
                times = rounds(binary, journal, steps, count, work)
                shown = ", ".join(f"{t * 1000:.0f} ms" for t in times)
                print(f"{name}: fork of a {steps}-step task to its first live step: {shown} "
                      f"(median {statistics.median(times) * 1000:.0f} ms)")
        finally:
            if os.environ.get("DURUN_BENCH_POSTGRES"):
                subprocess.run(["psql", os.environ["DURUN_BENCH_POSTGRES"], "-qc",
                                f"SET client_min_messages = warning; DROP SCHEMA IF EXISTS {schema} CASCADE"], check=False)


main()
