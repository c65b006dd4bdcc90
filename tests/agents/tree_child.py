"""A child agent for the sub-agent tests: one step, `work`, logged in
work-TOPIC.log when it runs (not when it replays); it waits for the file
CHILD_GATE, if set, before it commits; its result names its parent."""
import json, sys, os, time
n = 0
def ask(m):
    global n
    n += 1; m["id"] = n
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
    a = json.loads(sys.stdin.readline())
    assert a.get("ok"), a
    return a
args = json.loads(os.environ["DURUN_ARGS"])
parent = os.environ["DURUN_PARENT_TASK"]
opened = ask({"op": "begin", "name": "work", "args": args})
if not opened.get("replayed"):
    with open("work-" + args["topic"] + ".log", "a") as f: f.write("work\n")
    while os.environ.get("CHILD_GATE") and not os.path.exists(os.environ["CHILD_GATE"]):
        time.sleep(0.05)
    ask({"op": "commit", "step": opened["step"], "output": {"topic": args["topic"]}})
ask({"op": "result", "output": {"topic": args["topic"], "parent": parent}})
