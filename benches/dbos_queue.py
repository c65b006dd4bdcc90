#!/usr/bin/env python3
"""The same queue workload on DBOS Transact (Python) with PostgreSQL, for
benches/workers.py's figures: TASKS workflows of one trivial step enqueued
on a DBOS Queue, run by one process with `worker_concurrency=4`; tasks per
second from the first enqueue to the last result, and enqueue → start
latency.

    pip install dbos==3.4.0 && python3 benches/dbos_queue.py [--tasks 1000] [--url postgresql://…]

DBOS runs each task as a Python function inside its own process; a durun
worker runs each on a thread of its own and starts the agent command, a
process. `--json` prints one JSON object instead of the table rows
(benches/workers.py runs it so, in the same run as durun's pool).
"""

import argparse
import json
import logging
import subprocess
import statistics
import time
import uuid


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/")
    parser.add_argument("--poll", type=float, default=1.0, help="the queue's polling interval (DBOS ships 1 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    from dbos import DBOS

    started_at = {}

    @DBOS.step()
    def tiny(i: int) -> int:
        return i

    @DBOS.workflow()
    def task(i: int) -> int:
        started_at[i] = time.time()
        return tiny(i)

    database = "dbos_bench_" + uuid.uuid4().hex[:8]
    DBOS(config={"name": "dbos-bench", "system_database_url": args.url + database, "log_level": "WARNING"})
    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=4, polling_interval_sec=args.poll)
    begin = time.monotonic()
    handles = [queue.enqueue(task, i) for i in range(args.tasks)]
    for handle in handles:
        handle.get_result()
    rate = args.tasks / (time.monotonic() - begin)
    waits = []
    for i in range(50):
        enqueued = time.time()
        queue.enqueue(task, args.tasks + i).get_result()
        waits.append((started_at[args.tasks + i] - enqueued) * 1000)
        time.sleep(0.1)
    waits.sort()
    median, p99 = statistics.median(waits), waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    DBOS.destroy()
    # The database DBOS made for this run goes with it.
    subprocess.run(["psql", args.url + "postgres", "-qc", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"],
                   capture_output=True)
    if args.json:
        print(json.dumps({"tasks_per_second": rate, "start_median_ms": median, "start_p99_ms": p99}))
        return
    what = f"DBOS 3.4 queue, one process, `worker_concurrency=4`, polled every {args.poll:g} s"
    print("| %s: tasks run per second | %.0f |" % (what, rate))
    print("| %s: enqueue → workflow started, median / p99 | %.0f ms / %.0f ms |" % (what, median, p99))


if __name__ == "__main__":
    main()
