"""A node of a three-level tree of tasks for the sub-agent torture test
(SPEC 16): the root spawns three children, each child two grandchildren;
every node runs one `mutate` step, `work`, logging its task id and the
step's key to work.log when it runs, joins its children, and returns the
sum of the numbers below it plus its own (1): the root's output is 10."""
import json
import os
import sys
import time

_next = 0


def ask(message):
    global _next
    _next += 1
    message["id"] = _next
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
    answer = json.loads(sys.stdin.readline())
    if not answer.get("ok"):
        sys.exit(f"durun said no: {answer}")
    return answer


here = os.path.dirname(os.path.abspath(__file__))
depth = json.loads(os.environ.get("DURUN_ARGS") or "null") or 0
task = os.environ["DURUN_TASK_ID"]
opened = ask({"op": "begin", "name": "work", "args": {"depth": depth}, "effect": "mutate"})
if not opened.get("replayed"):
    with open("work.log", "a") as log:
        log.write(f"{task} {opened['idempotency_key']}\n")
    time.sleep(0.05)
    ask({"op": "commit", "step": opened["step"], "output": 1})
fanout = {0: 3, 1: 2}.get(depth, 0)
kids = [
    ask({"op": "spawn", "name": f"node {i}", "command": [sys.executable, os.path.join(here, "tree_node.py")],
         "args": depth + 1})["output"]["task"]
    for i in range(fanout)
]
total = 1
for kid in kids:
    joined = ask({"op": "join", "task": kid})["output"]
    total += joined["output"] if joined["status"] == "completed" else 0
ask({"op": "result", "output": total})
