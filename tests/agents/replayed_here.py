"""Steps replayed by the Python SDK itself from durun's `ahead` answers,
for tests/integration/replayed_here.rs. argv[1] is the scenario:

- `loop N`: N `read` steps; the first run exits 3, later runs 0. Each step
  returns the run it ran in, and the agent prints the runs it was given.
- `diverge N K`: the same loop, but on a resume step K's args change.
- `gather N`: N rounds of three coroutines, one of which begins two steps
  one after the other while the others begin one: the numbers the steps
  take depend on the order the coroutines run in.

Prints `seen: JSON` lines on stderr."""

import asyncio
import json
import os
import sys

import durun

run = int(os.environ["DURUN_RUN"])
scenario, count = sys.argv[1], int(sys.argv[2])


def seen(value):
    sys.stderr.write("seen: " + json.dumps(value) + "\n")


if scenario in ("loop", "diverge"):
    changed = int(sys.argv[3]) if scenario == "diverge" and run > 1 else 0
    runs = []
    for i in range(1, count + 1):
        args = {"i": i, "changed": True} if i == changed else {"i": i}
        runs.append(durun.step("s", args, lambda: {"run": run, "text": "x" * 50})["run"])
    seen(runs)
    sys.exit(3 if run == 1 else 0)

if scenario == "gather":
    async def ran():
        return run

    async def two(n):
        first = await durun.step("first", {"n": n}, ran)
        second = await durun.step("second", {"n": n}, ran)
        return [first, second]

    async def one(name, n):
        return await durun.step(name, {"n": n}, ran)

    async def main():
        got = []
        for n in range(count):
            got.append(await asyncio.gather(two(n), one("left", n), one("right", n)))
        return got

    seen(asyncio.run(main()))
    sys.exit(3 if run == 1 else 0)
