"""A pipelining agent for the torture in tests/integration/torture.rs.

STEPS steps through the SDK, which posts each commit without waiting for
it; every third step is `mutate` and writes its idempotency key to
EFFECTS (as an API would see it). Right after the commit of its KILL_AT-th
executed step (microseconds after the commit was sent) it SIGKILLs durun
and itself. Each executed step is logged as `RUN effect i key`."""
import os
import signal

import durun

steps = int(os.environ["STEPS"])
kill_at = int(os.environ.get("KILL_AT", "0"))
mark = os.environ["RUN_MARK"]
effects = open(os.environ["EFFECTS"], "a", buffering=1)
executed = 0


def work(i, effect):
    global executed
    executed += 1
    effects.write(f"{mark} {effect} {i} {durun.current().idempotency_key}\n")
    return {"i": i, "square": i * i}


total = 0
for i in range(1, steps + 1):
    effect = "mutate" if i % 3 == 0 else "read"
    before = executed
    value = durun.step(f"s{i}", {"i": i}, lambda: work(i, effect), effect)
    total += value["square"]
    if executed != before and executed == kill_at:
        os.kill(int(os.environ["DURUN_PID"]), signal.SIGKILL)
        os._exit(9)
durun.result({"total": total})
