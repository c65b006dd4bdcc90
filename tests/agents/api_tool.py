"""A command tool: creates a resource at $API_URL with the step's idempotency key."""
import json
import os
import sys
import urllib.request

if os.environ.get("TOOL_PIDFILE"):
    with open(os.environ["TOOL_PIDFILE"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.environ["TOOL_PIDFILE"] + ".tmp", os.environ["TOOL_PIDFILE"])
if os.environ.get("TOOL_PIDS"):
    # One file per running tool, for tests that kill tools.
    path = os.path.join(os.environ["TOOL_PIDS"], str(os.getpid()))
    open(path, "w").close()
args = json.load(sys.stdin)
req = urllib.request.Request(os.environ["API_URL"], data=json.dumps(args).encode(), method="POST",
                             headers={"Content-Type": "application/json",
                                      "Idempotency-Key": os.environ["DURUN_IDEMPOTENCY_KEY"],
                                      "Durun-Run": os.environ.get("DURUN_RUN", "")})
try:
    with urllib.request.urlopen(req, timeout=60) as reply:
        sys.stdout.write(reply.read().decode())
finally:
    if os.environ.get("TOOL_PIDS"):
        os.unlink(os.path.join(os.environ["TOOL_PIDS"], str(os.getpid())))
