"""Journal bytes of a long chat through durun's model proxy (SPEC 21).

    cargo build --release
    python3 benches/chat_journal.py [TURNS] [POSTGRES_URL]     # default 500

Runs tests/agents/chat_agent.py under `durun run` for TURNS turns against
the fake OpenAI server: each request carries the whole conversation, as a
chat agent's does. Then measures the journal:

- SQLite: the file's bytes once its WAL is folded in and it is vacuumed
  (`VACUUM INTO` a copy), and the bytes of its rows (args, outputs, the
  conversation's nodes);
- PostgreSQL, given a URL: the bytes of the steps and chat_nodes tables
  with their indexes and TOAST (`pg_total_relation_size`), in a schema of
  its own, dropped after.

Prints each against the bound: twice the distinct bytes of the
conversation and its answers, plus 1 KiB a step. Then, on SQLite, a resume:
the same chat killed (SIGKILL) before its last turn, and the time from
`durun resume` to the upstream's receiving the first new call, every
turn before it replayed."""

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 500
POSTGRES = sys.argv[2] if len(sys.argv) > 2 else None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURUN = os.environ.get("DURUN_BIN", os.path.join(ROOT, "target/release/durun"))
AGENTS = os.path.join(ROOT, "tests/agents")


@contextlib.contextmanager
def fake_openai(work):
    """The fake OpenAI server, and durun.toml in `work` pointing at it: the
    file its requests' times are logged to."""
    port_file = os.path.join(work, "llm.port")
    server = subprocess.Popen([sys.executable, os.path.join(AGENTS, "llm_server.py"), port_file])
    try:
        while not os.path.exists(port_file):
            time.sleep(0.02)
        port = open(port_file).read().strip()
        with open(os.path.join(work, "durun.toml"), "w") as out:
            out.write(f'[proxy.openai]\nupstream = "http://127.0.0.1:{port}/v1"\n')
        yield port_file + ".times"
    finally:
        server.terminate()
        server.wait()


def run_chat(work, journal):
    with fake_openai(work):
        env = dict(os.environ, DURUN_JOURNAL=journal)
        started = time.time()
        done = subprocess.run(
            [DURUN, "run", "--task", "chat", "--", sys.executable, os.path.join(AGENTS, "chat_agent.py"), str(TURNS)],
            cwd=work, env=env, capture_output=True, text=True, check=True,
        )
        seconds = time.time() - started
    printed = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    print(f"{TURNS} turns: {printed['distinct_bytes']:,} distinct bytes; every request and answer whole: "
          f"{printed['whole_bytes']:,} bytes; {seconds:.1f} s")
    return printed["distinct_bytes"]


def report(backend, measured, distinct, what):
    bound = 2 * distinct + 1024 * TURNS
    print(f"{backend:10} {what:28} {measured:>12,} bytes  bound {bound:>12,}  "
          f"{measured / distinct:5.2f}x distinct  {'within' if measured <= bound else 'OVER'}")


def sqlite(work):
    journal = os.path.join(work, "journal.db")
    distinct = run_chat(work, journal)
    copy = os.path.join(work, "vacuumed.db")
    connection = sqlite3.connect(journal)
    connection.execute(f"VACUUM INTO '{copy}'")
    rows = connection.execute(
        "SELECT (SELECT sum(length(args) + coalesce(length(output), 0)) FROM steps)"
        " + (SELECT coalesce(sum(length(hash) + coalesce(length(parent), 0) + length(message)), 0) FROM chat_nodes)"
    ).fetchone()[0]
    connection.close()
    report("sqlite", os.path.getsize(copy), distinct, "file (vacuumed)")
    report("sqlite", rows, distinct, "rows (args, outputs, nodes)")


def postgres(work, url):
    import urllib.parse
    schema = f"durun_chat_bench_{os.getpid()}"
    subprocess.run(["psql", url, "-qc", f"CREATE SCHEMA {schema}"], check=True)
    try:
        separator = "&" if "?" in url else "?"
        journal = f"{url}{separator}options=-c%20search_path%3D{urllib.parse.quote(schema)}"
        distinct = run_chat(work, journal)
        size = subprocess.run(
            ["psql", url, "-tAc",
             f"SELECT pg_total_relation_size('{schema}.steps') + pg_total_relation_size('{schema}.chat_nodes')"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        report("postgres", int(size), distinct, "steps + chat_nodes tables")
    finally:
        subprocess.run(["psql", url, "-qc", f"DROP SCHEMA {schema} CASCADE"], check=True, capture_output=True)


def resume(work):
    with fake_openai(work) as times:
        hold = os.path.join(work, "hold")
        env = dict(os.environ, DURUN_JOURNAL=os.path.join(work, "journal.db"), HOLD_FILE=hold,
                   HOLD_AFTER=str(TURNS - 1))
        agent = [sys.executable, os.path.join(AGENTS, "chat_agent.py"), str(TURNS)]
        first = subprocess.Popen([DURUN, "run", "--task", "chat", "--", *agent], cwd=work, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not os.path.exists(hold + ".reached"):
            time.sleep(0.01)
        first.kill()
        first.wait()
        open(hold, "w").close()
        started = time.time()
        subprocess.run([DURUN, "resume", "chat"], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = f"turn {TURNS - 1}:"
    for line in open(times):
        at, key = line.split(" ", 1)
        if key.split(" ", 1)[1].startswith(last):
            print(f"resume of a {TURNS}-turn chat to its first new call: {float(at) - started:.3f} s "
                  f"({TURNS - 1} turns replayed)")
            break


with tempfile.TemporaryDirectory() as work:
    sqlite(work)
with tempfile.TemporaryDirectory() as work:
    resume(work)
if POSTGRES:
    with tempfile.TemporaryDirectory() as work:
        postgres(work, POSTGRES)
