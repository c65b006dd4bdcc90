"""What `durun test` costs: an agent of 8 steps whose model calls take a
second each (4 model calls through the proxy to a slow local upstream, 4
model steps the agent journals itself), crash-tested at every step and
point.

    cargo build --release
    python3 benches/test_cost.py [JOBS]        # default 1, then 4

Prints the reference's time, the number of trials, and the whole test's
time for each JOBS, with the ratio to the reference's time × trials ÷
jobs (what the trials would cost if each paid its model calls again)."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURUN = os.environ.get("DURUN_BIN", os.path.join(ROOT, "target/release/durun"))
JOBS = [int(arg) for arg in sys.argv[1:]] or [1, 4]

AGENT = r'''
import json, os, sys, time, urllib.request
out, ids = sys.stdout, iter(range(1, 10**6))
sys.stdout = sys.stderr
def request(message):
    message["id"] = next(ids)
    out.write(json.dumps(message) + "\n"); out.flush()
    return json.loads(sys.stdin.readline())
def proxied(prompt):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"]
def journaled(prompt):
    opened = request({"op": "begin", "name": "llm", "args": {"prompt": prompt}})
    if opened["replayed"]:
        return opened["output"]
    time.sleep(1)
    request({"op": "commit", "step": opened["step"], "output": "said " + prompt,
             "usage": {"input_tokens": 500, "output_tokens": 100}})
    return "said " + prompt
said = []
for i in range(4):
    said.append(proxied(f"call {i} after {len(said)}"))
    said.append(journaled(f"step {i} after {len(said)}"))
request({"op": "result", "output": said})
'''


class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(1)
        data = json.dumps({"choices": [{"message": {"content": "ok"}}],
                           "usage": {"prompt_tokens": 500, "completion_tokens": 100}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch:
        agent = os.path.join(scratch, "agent.py")
        with open(agent, "w") as f:
            f.write(AGENT)
        env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{server.server_port}/v1")
        for jobs in JOBS:
            started = time.monotonic()
            done = subprocess.run([DURUN, "test", "--json", "--jobs", str(jobs), "--", "python3", agent],
                                  cwd=scratch, env=env, capture_output=True, text=True)
            took = time.monotonic() - started
            report = json.loads(done.stdout)
            reference = report["reference"]["took_ms"] / 1000
            trials = len(report["trials"])
            paid = reference * trials / jobs
            print(f"jobs {jobs}: reference {reference:.1f} s, {trials} trials, all ok: {report['ok']}; "
                  f"durun test {took:.1f} s = {took / paid:.2f} × (reference × trials ÷ jobs = {paid:.0f} s)")


main()
