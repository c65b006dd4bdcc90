"""The Python twin of step_then_call.mjs: short steps through the SDK,
each followed at once by a model call the SDK knows nothing of (urllib
through durun's proxy)."""
import json
import os
import sys
import time
import urllib.request

import durun

calls = int(sys.argv[1])
for i in range(calls):
    durun.step("quick", {"i": i}, lambda: i)
    request = urllib.request.Request(
        f"{os.environ['OPENAI_BASE_URL']}/chat/completions",
        method="POST",
        headers={"content-type": "application/json", "authorization": "Bearer test"},
        data=json.dumps({"model": "m", "messages": [{"role": "user", "content": f"call {i}"}]}).encode(),
    )
    with urllib.request.urlopen(request) as answer:
        json.load(answer)
open(os.environ["REACHED"], "w").close()
while not os.path.exists(os.environ["RELEASE"]):
    time.sleep(0.01)
durun.result(calls)
