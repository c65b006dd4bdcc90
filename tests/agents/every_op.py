"""Sends every op of durun's protocol through the Python SDK's own
encoders, for tests/integration/conformance.rs, which reads each line on
its way to durun. The first run sends the ops a new run sends and exits 3;
the resume replays those steps itself (`ahead`, `replayed`), then waits
for the signal the test sent and stores the task's result."""

import datetime
import os
import sys

import durun

run = int(os.environ["DURUN_RUN"])

for i in range(3):
    durun.step("read", {"i": i}, lambda: {"i": i})
durun.step("open-pr", {"branch": "fix"}, lambda: {"url": "https://example.test/pull/7"}, effect="mutate")
tries = []


def flaky():
    tries.append(1)
    if len(tries) == 1:
        raise RuntimeError("the first try fails")
    return "second try"


durun.step("flaky", {}, flaky, retries=1, backoff=0.01)
durun.call("echo", text="hi")
durun.patched("prompt-2")
durun.sleep(0.01)
# A moment already past: a changed `until` on the resume would be divergence.
durun.sleep(datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
child = durun.spawn("child", ["true"], {"topic": "x"})
durun.join(child, timeout=60)
if run == 1:
    sys.exit(3)
durun.wait("go", {"asked": "deploy?"}, timeout=60)
durun.result({"done": True})
