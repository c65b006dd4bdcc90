"""Creates a resource at $API_URL with $DURUN_IDEMPOTENCY_KEY (for shell agents)."""
import json
import os
import sys
import urllib.request

request = urllib.request.Request(os.environ["API_URL"], data=json.dumps({"title": sys.argv[1]}).encode(), method="POST",
                                 headers={"Idempotency-Key": os.environ["DURUN_IDEMPOTENCY_KEY"]})
with urllib.request.urlopen(request, timeout=60) as reply:
    print(json.dumps(json.loads(reply.read())))
