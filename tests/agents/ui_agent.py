"""An agent for the web view's tests, speaking the raw protocol: its step
names, outputs, errors and the data it waits with hold markup, event
handler attributes, a javascript: URL and (all but the names) an ESC
sequence, which the page must show as text.

Environment: UI_STEPS (model steps, default 3), UI_SLEEP (seconds each
takes, default 0), UI_WAIT (a signal to wait for at the end, if set),
UI_PLAIN (set: names and outputs of an ordinary release agent instead, for
the screenshots).
"""
import json
import os
import sys
import time

EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)> <a href=\"javascript:alert(3)\">x</a> \x1b[31mred"
_next = 0


def ask(message, must=True):
    global _next
    _next += 1
    message["id"] = _next
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
    answer = json.loads(sys.stdin.readline())
    if must and not answer.get("ok"):
        sys.exit(f"durun said no: {answer}")
    return answer


PLAIN = bool(os.environ.get("UI_PLAIN"))
NAMES = ["llm.plan", "repo.read_changelog", "llm.draft_notes", "llm.review", "ci.status", "llm.summarize"]
if PLAIN:
    EVIL = "release 1.4.0: 12 changes, 2 fixes"

outputs = []
for i in range(int(os.environ.get("UI_STEPS", "3"))):
    # A name may hold markup, never a control character (durun refuses it).
    name = NAMES[i % len(NAMES)] if PLAIN else f"llm.plan {i} {EVIL.replace(chr(27), '')}"
    opened = ask({"op": "begin", "name": name, "args": {"prompt": EVIL, "i": i}})
    if opened.get("replayed"):
        outputs.append(opened["output"])
        continue
    time.sleep(float(os.environ.get("UI_SLEEP", "0")))
    output = {"text": EVIL, "i": i}
    ask({"op": "commit", "step": opened["step"], "output": output,
         "usage": {"input_tokens": 100, "output_tokens": 20}})
    outputs.append(output)
# A failure the agent went on from: a replay answers it as an error.
opened = ask({"op": "begin", "name": "github.create_pr" if PLAIN else "tool.flaky", "args": {"why": EVIL},
              "effect": "mutate" if PLAIN else "read"}, must=False)
if opened.get("ok") and not opened.get("replayed"):
    if PLAIN:
        ask({"op": "commit", "step": opened["step"], "output": {"url": "https://github.com/acme/web/pull/7"}})
    else:
        ask({"op": "fail", "step": opened["step"], "error": f"refused: {EVIL}"})
answer = None
if os.environ.get("UI_WAIT"):
    answer = ask({"op": "wait", "name": os.environ["UI_WAIT"], "data": {"diff": EVIL}})["output"]
ask({"op": "result", "output": {"steps": len(outputs), "answer": answer, "note": EVIL}})
