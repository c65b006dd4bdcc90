"""A parent agent for the sub-agent tests (SPEC 16), on the raw protocol:
spawns two children (tree_child.py, with args {"topic": "a"} and "b"; on
the queue CHILD_QUEUE if set) and joins them; its result is what the
joins answered."""
import json, sys, os
n = 0
def ask(m):
    global n
    n += 1; m["id"] = n
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
    a = json.loads(sys.stdin.readline())
    assert a.get("ok"), a
    return a
queue = os.environ.get("CHILD_QUEUE")
kids = []
for topic in ["a", "b"]:
    m = {"op": "spawn", "name": "research " + topic, "command": ["python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "tree_child.py")], "args": {"topic": topic}}
    if queue: m["queue"] = queue
    kids.append(ask(m)["output"]["task"])
joined = [ask({"op": "join", "task": kid})["output"] for kid in kids]
ask({"op": "result", "output": {"joined": joined}})
