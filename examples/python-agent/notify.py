"""A `mutate` command tool: posts a notification with the step's key."""
import json
import os
import sys
import urllib.request

args = json.load(sys.stdin)
url = f"http://127.0.0.1:{os.environ.get('FAKE_PORT', '8765')}/notify"
request = urllib.request.Request(url, data=json.dumps(args).encode(), method="POST",
                                 headers={"Idempotency-Key": os.environ["DURUN_IDEMPOTENCY_KEY"]})
with urllib.request.urlopen(request, timeout=30) as reply:
    print(reply.read().decode())
