#!/usr/bin/env python3
"""Figures for a pool of durun workers on PostgreSQL (docs/performance.md).

    cargo build --release && python3 benches/workers.py [--tasks 1000] [--url postgres://…]

- throughput: TASKS tiny tasks (`true`) submitted, then 1, 2 and 4 workers
  (`--jobs 4` each, distinct DURUN_HOST_IDs) run them; tasks per second
  from the first worker's start to the last task's end;
- latency: one idle worker; a task submitted every 100 ms, 50 times; from
  the submit's return to the run's start as the journal records it
  (median, p99);
- idle cost: transactions per second the server counts while one worker
  waits with nothing to do.

Each measurement uses a schema of its own on the server. Prints a Markdown
table.
"""

import argparse
import json
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


def completed(durun, schema):
    out = subprocess.run([durun, "inspect", "--json", "--status", "completed"], env=env_for(schema),
                         check=True, capture_output=True, text=True)
    return len(json.loads(out.stdout)["tasks"])


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
        started = time.monotonic()
        pool = start_workers(durun, schema, workers, workdir)
        while completed(durun, schema) < tasks:
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        stop_workers(pool)
        return tasks / elapsed
    finally:
        schema.drop()


def latency(durun, base, samples, workdir):
    schema = Schema(base)
    try:
        pool = start_workers(durun, schema, 1, workdir)
        time.sleep(1)
        waits = []
        for _ in range(samples):
            out = subprocess.run([durun, "-q", "submit", "--", "true"], env=env_for(schema), cwd=workdir,
                                 check=True, capture_output=True, text=True)
            submitted = time.time()
            task = out.stdout.strip()
            while True:
                shown = subprocess.run([durun, "inspect", task, "--json"], env=env_for(schema),
                                       capture_output=True, text=True)
                runs = json.loads(shown.stdout)["task"]["runs"] if shown.returncode == 0 else []
                if runs:
                    break
                time.sleep(0.002)
            # The run's start as the journal records it (RFC 3339, UTC).
            stamp = runs[0]["started_at"]
            started = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            started += float("0." + stamp[20:23]) if len(stamp) > 20 else 0
            waits.append(max(0.0, started - submitted) * 1000)
            time.sleep(0.1)
        stop_workers(pool)
        waits.sort()
        return statistics.median(waits), waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    finally:
        schema.drop()


def idle_cost(durun, base, workdir, seconds=10):
    schema = Schema(base)
    try:
        pool = start_workers(durun, schema, 1, workdir)
        time.sleep(1)
        query = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        before = int(psql(base, query))
        time.sleep(seconds)
        after = int(psql(base, query))
        stop_workers(pool)
        # Two of the counted transactions are these two queries.
        return (after - before - 2) / seconds
    finally:
        schema.drop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--url", default=os.environ.get("DURUN_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if shutil.which("psql") is None:
        sys.exit("psql is needed")
    durun = durun_bin()
    workdir = os.getcwd()
    print(f"durun {durun}, {args.tasks} tasks of `true`, PostgreSQL {psql(args.url, 'SHOW server_version')}")
    print()
    print("| measure | figure |")
    print("|---|---|")
    for workers in (1, 2, 4):
        rate = throughput(durun, args.url, args.tasks, workers, workdir)
        print(f"| {workers} worker{'s' if workers > 1 else ''} (`--jobs 4` each): tasks run per second | {rate:.0f} |", flush=True)
    median, p99 = latency(durun, args.url, 50, workdir)
    print(f"| submit → run started, one idle worker: median / p99 | {median:.0f} ms / {p99:.0f} ms |", flush=True)
    print(f"| an idle worker: transactions per second on the server | {idle_cost(durun, args.url, workdir):.1f} |")


if __name__ == "__main__":
    main()
