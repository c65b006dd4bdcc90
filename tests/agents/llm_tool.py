"""A command tool: sends its args (JSON on stdin) to the fake LLM at $LLM_URL."""
import json
import os
import sys
import urllib.request

args = json.load(sys.stdin)
req = urllib.request.Request(os.environ["LLM_URL"], data=json.dumps(args).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=60) as reply:
    sys.stdout.write(reply.read().decode())
