"""Asks the fake LLM at $LLM_URL and prints the text (for shell agents)."""
import json
import os
import sys
import urllib.request

request = urllib.request.Request(os.environ["LLM_URL"], data=json.dumps({"prompt": sys.argv[1]}).encode(), method="POST")
with urllib.request.urlopen(request, timeout=60) as reply:
    print(json.loads(reply.read())["text"])
