"""A chat agent that talks for TURNS turns through OPENAI_BASE_URL (durun's
proxy), each request carrying the whole conversation, as chat agents do.
Each user message is about 300 bytes. Prints one JSON line: the turns, and
the distinct bytes of the conversation (each message once, as JSON) and
of the answers (each body as it came), and the bytes of every request's
body and answer, what a journal that keeps each request whole holds.

It keeps one connection open, as the `openai` and `anthropic` clients do
(an httpx pool), rather than a new one a request.

With HOLD_FILE set, it holds before turn HOLD_AFTER until that file
exists (writing HOLD_FILE.reached): where a bench kills its run.

    chat_agent.py TURNS"""

import http.client
import json
import os
import sys
import time
import urllib.parse

turns = int(sys.argv[1])
base = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
connection = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
history = [{"role": "system", "content": "You are a careful coding agent. " * 4}]
answers = 0
sent = 0
hold = os.environ.get("HOLD_FILE")
for turn in range(turns):
    if hold and turn == int(os.environ["HOLD_AFTER"]) and not os.path.exists(hold):
        open(hold + ".reached", "w").close()
        while not os.path.exists(hold):
            time.sleep(0.01)
    history.append({"role": "user", "content": f"turn {turn}: " + "please look at the next file and say what to change. " * 5})
    body = json.dumps({"model": "gpt-4o-mini", "messages": history}).encode()
    sent += len(body)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-test"}
    connection.request("POST", base.path.rstrip("/") + "/chat/completions", body, headers)
    answer = connection.getresponse()
    raw = answer.read()
    assert answer.status == 200, (answer.status, raw[:200])
    answers += len(raw)
    history.append(json.loads(raw)["choices"][0]["message"])
distinct = sum(len(json.dumps(message, separators=(",", ":"))) for message in history) + answers
print(json.dumps({"turns": turns, "distinct_bytes": distinct, "whole_bytes": sent + answers}), flush=True)
