#!/usr/bin/env python3
"""Figures for a pool of durun workers on PostgreSQL (docs/performance.md).

    cargo build --release && python3 benches/workers.py [--tasks 1000] [--rounds 3] [--url postgres://…]

- throughput: TASKS tiny tasks (`true`) submitted, then one worker
  (`--jobs 4`) runs them; tasks per second from the worker's start to the
  last task's end (the last run's end as the journal records it). In the same round, when the `dbos` package is installed
  (`pip install dbos==3.4.0`), the same count of tasks on a DBOS queue with
  `worker_concurrency=4` polled every 10 ms (benches/dbos_queue.py), and
  the ratio of the two, round by round;
- with `--pool`: 2 and 4 workers (`--jobs 4` each, distinct DURUN_HOST_IDs);
- latency: one idle worker; a task submitted every 50 ms, 200 times; from
  the submit's record to the run's start, both as the journal stamps them
  (median, p99 by nearest rank);
- idle cost: transactions per second the server counts while one worker
  waits with nothing to do, with one queue and with two, on a database of
  its own (nothing else counts there).

Each durun measurement uses a schema of its own on the server. Prints a
Markdown table: each figure as the range over the rounds.
"""

import argparse
import datetime
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def durun_bin():
    for profile in ("release", "debug"):
        path = os.path.join(ROOT, "target", profile, "durun")
        if os.path.exists(path):
            return path
    sys.exit("build durun first: cargo build --release")


def psql(base, sql):
    return subprocess.run(["psql", base, "-qtAc", sql], check=True, capture_output=True, text=True).stdout.strip()


class Session:
    """One psql session for a poll: a psql started for each look would
    cost the cores the workers use a process and a server backend each."""

    def __init__(self, base):
        self.psql = subprocess.Popen(["psql", base, "-qtAX"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def value(self, sql):
        self.psql.stdin.write(sql + ";\n")
        self.psql.stdin.flush()
        return self.psql.stdout.readline().strip()

    def close(self):
        self.psql.stdin.close()
        self.psql.wait()


class Schema:
    def __init__(self, base):
        self.base = base
        self.name = "durun_bench_" + uuid.uuid4().hex[:8]
        psql(base, f"CREATE SCHEMA {self.name}")
        sep = "&" if "?" in base else "?"
        self.url = f"{base}{sep}options=-c%20search_path%3D{self.name}"

    def drop(self):
        psql(self.base, f"DROP SCHEMA {self.name} CASCADE")


def env_for(schema, host=None):
    env = dict(os.environ, DURUN_JOURNAL=schema.url)
    if host:
        env["DURUN_HOST_ID"] = host
    return env


def submit(durun, schema, count, workdir):
    ids = []
    for _ in range(count):
        out = subprocess.run([durun, "-q", "submit", "--", "true"], env=env_for(schema), cwd=workdir,
                             check=True, capture_output=True, text=True)
        ids.append(out.stdout.strip())
    return ids


def start_workers(durun, schema, count, workdir):
    return [subprocess.Popen([durun, "-q", "worker", "--jobs", "4"], env=env_for(schema, f"bench-{i}"),
                             cwd=workdir, stderr=subprocess.DEVNULL) for i in range(count)]


def stop_workers(workers):
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait()


def throughput(durun, base, tasks, workers, workdir):
    schema = Schema(base)
    try:
        submit(durun, schema, tasks, workdir)
        started = time.time()
        pool = start_workers(durun, schema, workers, workdir)
        # A count is one light query on one session: a poll must not take
        # the cores the workers use. The end is the last run's end as the
        # journal records it, not the poll that saw it.
        count = f"SELECT count(*) FROM {schema.name}.tasks WHERE status = 'completed'"
        poll = Session(base)
        while int(poll.value(count)) < tasks:
            time.sleep(0.25)
        poll.close()
        stop_workers(pool)
        last = psql(base, f"SELECT max(finished_at) FROM {schema.name}.runs")
        ended = datetime.datetime.fromisoformat(last.replace("Z", "+00:00")).timestamp()
        return tasks / (ended - started)
    finally:
        schema.drop()


def latency(durun, base, samples, workdir):
    """From the submit's record to the run's start, both as the journal
    stamps them (milliseconds, one clock): the submitting process's own
    exit comes after the worker may have started the run, so its return
    is no start to measure from."""
    schema = Schema(base)
    try:
        pool = start_workers(durun, schema, 1, workdir)
        time.sleep(1)
        poll = Session(base)
        waits = []
        for _ in range(samples):
            out = subprocess.run([durun, "-q", "submit", "--", "true"], env=env_for(schema), cwd=workdir,
                                 check=True, capture_output=True, text=True)
            task = out.stdout.strip()
            # One row always (an empty line until the run is there): psql
            # prints nothing for no rows, and the poll reads a line.
            gap = (f"SELECT coalesce((SELECT extract(epoch FROM r.started_at::timestamptz - "
                   f"t.created_at::timestamptz) * 1000 FROM {schema.name}.tasks t "
                   f"JOIN {schema.name}.runs r ON r.task_id = t.id WHERE t.id = '{task}' AND r.run = 1)::text, '')")
            while True:
                shown = poll.value(gap)
                if shown:
                    break
                # Looking less often only keeps the poll off the worker's cores.
                time.sleep(0.01)
            waits.append(float(shown))
            time.sleep(0.05)
        poll.close()
        stop_workers(pool)
        waits.sort()
        return statistics.median(waits), waits[math.ceil(len(waits) * 0.99) - 1]
    finally:
        schema.drop()


def idle_cost(durun, base, workdir, queues, seconds=20):
    database = "durun_bench_idle_" + uuid.uuid4().hex[:8]
    psql(base, f"CREATE DATABASE {database}")
    url = base.rsplit("/", 1)[0] + "/" + database
    try:
        args = [durun, "-q", "worker"] + [arg for queue in queues for arg in ("--queue", queue)]
        worker = subprocess.Popen(args, env=dict(os.environ, DURUN_JOURNAL=url), cwd=workdir,
                                  stderr=subprocess.DEVNULL)
        time.sleep(3)
        query = f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{database}'"
        before = int(psql(base, query))
        time.sleep(seconds)
        after = int(psql(base, query))
        stop_workers([worker])
        return (after - before) / seconds
    finally:
        psql(base, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def dbos(base, tasks):
    """DBOS's queue on the same server, polled every 10 ms; None without the package."""
    if importlib.util.find_spec("dbos") is None:
        return None
    url = base.rsplit("/", 1)[0] + "/"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benches", "dbos_queue.py"), "--tasks", str(tasks),
                          "--poll", "0.01", "--url", url, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def span(values, fmt="{:.0f}"):
    low, high = min(values), max(values)
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}–{fmt.format(high)}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool", action="store_true", help="also 2 and 4 workers")
    parser.add_argument("--url", default=os.environ.get("DURUN_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if shutil.which("psql") is None:
        sys.exit("psql is needed")
    durun = durun_bin()
    workdir = os.getcwd()
    cores = os.cpu_count()
    print(f"durun {durun}, {args.tasks} tasks of `true`, {args.rounds} rounds, {cores} cores, "
          f"PostgreSQL {psql(args.url, 'SHOW server_version')}", flush=True)
    ours, theirs, ratios, loads = [], [], [], []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        ours.append(throughput(durun, args.url, args.tasks, 1, workdir))
        peer = dbos(args.url, args.tasks)
        if peer is not None:
            theirs.append(peer)
            ratios.append(ours[-1] / peer["tasks_per_second"])
        print(f"round {len(ours)}: durun {ours[-1]:.0f}/s" +
              (f", DBOS {theirs[-1]['tasks_per_second']:.0f}/s, {ratios[-1]:.2f}x" if peer else ""), flush=True)
    if max(loads) > cores:
        print(f"warning: the load average was {max(loads):.1f} on {cores} cores during the rounds", flush=True)
    print()
    print("| measure | figure |")
    print("|---|---|")
    print(f"| durun, 1 worker (`--jobs 4`): tasks run per second | {span(ours)} |")
    if theirs:
        print(f"| DBOS 3.4 queue, `worker_concurrency=4`, polled every 10 ms: tasks run per second | "
              f"{span([peer['tasks_per_second'] for peer in theirs])} |")
        print(f"| durun over DBOS, round by round | {span(ratios, '{:.2f}')}× |")
        print(f"| DBOS, enqueue → workflow started: median / p99 | "
              f"{span([peer['start_median_ms'] for peer in theirs])} ms / {span([peer['start_p99_ms'] for peer in theirs])} ms |")
    else:
        print("| DBOS | not measured: `pip install dbos==3.4.0` |")
    if args.pool:
        for workers in (2, 4):
            rate = throughput(durun, args.url, args.tasks, workers, workdir)
            print(f"| durun, {workers} workers (`--jobs 4` each): tasks run per second | {rate:.0f} |", flush=True)
    medians, p99s = [], []
    for _ in range(args.rounds):
        median, p99 = latency(durun, args.url, 200, workdir)
        medians.append(median)
        p99s.append(p99)
    print(f"| durun, submit recorded → run started, one idle worker: median / p99 | {span(medians)} ms / {span(p99s)} ms |",
          flush=True)
    for queues in (["default"], ["a", "b"]):
        cost = idle_cost(durun, args.url, workdir, queues)
        print(f"| durun, an idle worker with {len(queues)} queue{'s' if len(queues) > 1 else ''}: "
              f"transactions per second on the server | {cost:.2f} |", flush=True)


if __name__ == "__main__":
    main()
