"""Shared rate limits (SPEC 19), two figures a journal:

1. AGENTS (50) agents, each a `durun run` of its own, call a fake upstream
   that allows RPM (600) requests in any 60 s (a sliding window, 429
   past it) under `[limits.upstream] rpm = RPM`, for SECONDS (90). Prints
   the 429s the upstream sent and the requests it answered in the last 60
   s of the run, against RPM.
2. The latency a limit that never bites adds to a proxied call: one agent
   makes CALLS (300) calls one after another, without `[limits]` and with
   `rpm = 100000000`, alternating ROUNDS (3) times; prints each median per
   call and the difference.

On SQLite and, with DURUN_BENCH_POSTGRES (a URL), on PostgreSQL too.

    cargo build --release
    python3 benches/limits.py target/release/durun
    DURUN_BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432/test python3 benches/limits.py target/release/durun

Env: AGENTS, RPM, SECONDS, CALLS, ROUNDS; ONLY=pacing|latency for one half."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Calls the upstream until $UNTIL (a time), with the real `openai` client;
# in latency mode ($CALLS), that many calls, timing each, written to $OUT.
AGENT = r"""
import json, os, sys, time
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
me = os.environ["ME"]
def call(i):
    client.chat.completions.create(model="m", max_tokens=5,
        messages=[{"role": "user", "content": f"{me} {i}"}])
if "CALLS" in os.environ:
    call(-1)  # the client's first call sets up its connection
    times = []
    for i in range(int(os.environ["CALLS"])):
        started = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - started)
    with open(os.environ["OUT"], "w") as out:
        json.dump(times, out)
    sys.exit(0)
until = float(os.environ["UNTIL"])
i = 0
while time.time() < until:
    try:
        call(i)
    except openai.APIError as exc:
        print(f"{me}: {exc}", file=sys.stderr)
    i += 1
"""

ANSWER = json.dumps({
    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}).encode()


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and body in one write, flushed at the end of the request:
    # no 40 ms wait for a delayed ACK between them.
    wbufsize = 1 << 16
    rpm = 600
    lock = threading.Lock()
    answered = []
    refused = [0]

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        now = time.time()
        with Upstream.lock:
            recent = [t for t in Upstream.answered[-Upstream.rpm:] if t > now - 60]
            over = len(recent) >= Upstream.rpm
            if over:
                Upstream.refused[0] += 1
            else:
                Upstream.answered.append(now)
        if over:
            body = b'{"error": {"type": "rate_limit", "message": "over the limit"}}'
            self.send_response(429)
            self.send_header("retry-after", "1")
        else:
            body = ANSWER
            self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def pacing(binary, journal, work, base):
    agents = int(os.environ.get("AGENTS", "50"))
    rpm = int(os.environ.get("RPM", "600"))
    seconds = float(os.environ.get("SECONDS", "90"))
    Upstream.rpm = rpm
    Upstream.answered.clear()
    Upstream.refused[0] = 0
    config = os.path.join(work, "limited")
    os.makedirs(config, exist_ok=True)
    with open(os.path.join(config, "durun.toml"), "w") as out:
        out.write(f'[limits.upstream]\nmatch = "openai"\nrpm = {rpm}\n')
    until = time.time() + seconds
    env = dict(os.environ, OPENAI_BASE_URL=base, UNTIL=repr(until))
    runs = [subprocess.Popen([binary, "--journal", journal, "-q", "run", "--", sys.executable,
                              os.path.join(work, "agent.py")],
                             cwd=config, env=dict(env, ME=f"agent{i}"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(agents)]
    for run in runs:
        run.wait()
    last_minute = [t for t in Upstream.answered if until - 60 <= t <= until]
    print(f"  {agents} agents, upstream allows {rpm}/min: {Upstream.refused[0]} answered 429, "
          f"{len(last_minute)} answered in the last minute ({len(last_minute) / rpm:.2f} of {rpm})")


def latency(binary, journal, work, base):
    calls = int(os.environ.get("CALLS", "300"))
    count = int(os.environ.get("ROUNDS", "3"))
    Upstream.rpm = 10 ** 9
    dirs = {}
    for name, config in [("no limit", ""), ("a limit that never bites",
                                             '[limits.upstream]\nmatch = "openai"\nrpm = 100000000\n')]:
        path = os.path.join(work, name.replace(" ", "-"))
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "durun.toml"), "w") as out:
            out.write(config)
        dirs[name] = path
    medians = {name: [] for name in dirs}
    for _ in range(count):
        for name, path in dirs.items():
            out = os.path.join(work, "times.json")
            env = dict(os.environ, OPENAI_BASE_URL=base, ME="latency", CALLS=str(calls), OUT=out)
            subprocess.run([binary, "--journal", journal, "-q", "run", "--", sys.executable,
                            os.path.join(work, "agent.py")], cwd=path, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(out) as text:
                medians[name].append(statistics.median(json.load(text)) * 1000)
    for name, values in medians.items():
        shown = ", ".join(f"{value:.3f}" for value in values)
        print(f"  {name}: {shown} ms a call (median per round)")
    added = [limited - plain for plain, limited in zip(*medians.values())]
    print(f"  added by the limit: {', '.join(f'{ms:+.3f}' for ms in added)} ms a call")


def main():
    binary = os.path.abspath(sys.argv[1])
    only = os.environ.get("ONLY")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "agent.py"), "w") as out:
            out.write(AGENT)
        journals = [("SQLite", os.path.join(work, "journal.db"))]
        schema = f"durun_limits_bench_{os.getpid()}"
        if os.environ.get("DURUN_BENCH_POSTGRES"):
            url = os.environ["DURUN_BENCH_POSTGRES"]
            subprocess.run(["psql", url, "-qc", f"CREATE SCHEMA {schema}"], check=True)
            separator = "&" if "?" in url else "?"
            journals.append(("PostgreSQL", f"{url}{separator}options=-c%20search_path%3D{schema}"))
        try:
            for name, journal in journals:
                print(f"{name}:")
                if only in (None, "pacing"):
                    pacing(binary, journal, work, base)
                if only in (None, "latency"):
                    latency(binary, journal, work, base)
        finally:
            if os.environ.get("DURUN_BENCH_POSTGRES"):
                subprocess.run(["psql", os.environ["DURUN_BENCH_POSTGRES"], "-qc",
                                f"SET client_min_messages = warning; DROP SCHEMA IF EXISTS {schema} CASCADE"],
                               check=False)


main()
