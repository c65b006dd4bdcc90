"""A scriptable agent for durun's tests, speaking the raw protocol.

usage: scripted.py PLAN.json

The plan is {"steps": [...], "pidfile": optional path, "escapees": optional
directory}. With "escapees" the agent first starts three processes that
try to outlive it (one in a session of its own, the child of a double
fork, and one a `node` launcher starts detached), each writing its pid to a
file in that directory. Each step is either
{"wait": NAME} (a signal's data is its output), {"sleep": SECONDS},
{"call": TOOL, "args": {...}}, {"parallel": [CALL, ...]} (every call sent
before any answer is read), or {"begin": NAME, "args": {...}, "effect": E,
"do": ACTION}, where ACTION is one of
  {"llm": true}            POST args to $LLM_URL, commit its text and usage
  {"api": true}            POST args to $API_URL with the step's key
  {"read": true}           POST args to $API_URL as a read (creates nothing)
  {"value": V}             commit V
  {"sleep_ms": N}          sleep N ms, then commit "slept"
  {"wait_for": PATH}       write PATH.waiting (the step's begin was
                           answered), wait until PATH exists, then commit
                           "waited"
  {"exit_unless": PATH, "code": N}  exit N at once unless PATH exists
At the end it sends `result` with every step's output and exits 0. A
response that is not ok makes it exit 3.
"""
import json
import os
import sys
import time
import urllib.request

_next_id = 0


def request(message):
    return request_all([message])[0]


def request_all(messages):
    global _next_id
    ids = []
    for message in messages:
        _next_id += 1
        message["id"] = _next_id
        ids.append(_next_id)
        sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
    answers = {}
    while len(answers) < len(ids):
        line = sys.stdin.readline()
        if not line:
            sys.exit("agent: durun closed the protocol")
        response = json.loads(line)
        assert response["id"] in ids, (response, ids)
        answers[response["id"]] = response
    return [answers[i] for i in ids]


def post(url, body, headers=None):
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as reply:
        return json.loads(reply.read())


def run_header():
    return {"Durun-Run": os.environ.get("DURUN_RUN", "")}


def perform(action, args, opened):
    if "read" in action:
        return post(os.environ["API_URL"], args, {"Durun-Read": "1", **run_header()})["read"], None
    if "llm" in action:
        answer = post(os.environ["LLM_URL"], args)
        return answer["text"], answer["usage"]
    if "api" in action:
        return post(os.environ["API_URL"], args,
                    {"Idempotency-Key": opened["idempotency_key"], **run_header()}), None
    if "value" in action:
        return action["value"], None
    if "sleep_ms" in action:
        time.sleep(action["sleep_ms"] / 1000)
        return "slept", None
    if "wait_for" in action:
        # A test waits on this file, not on a guess of how long it takes.
        open(action["wait_for"] + ".waiting", "w").close()
        while not os.path.exists(action["wait_for"]):
            time.sleep(0.02)
        return "waited", None
    if "exit_unless" in action:
        if not os.path.exists(action["exit_unless"]):
            sys.exit(action.get("code", 1))
        return "passed", None
    raise ValueError(action)


def start_escapees(directory):
    import subprocess
    escape = os.path.join(os.path.dirname(os.path.abspath(__file__)), "escape.sh")
    subprocess.run(["sh", escape, directory], check=True)


def main():
    plan = json.load(open(sys.argv[1]))
    if plan.get("escapees"):
        start_escapees(plan["escapees"])
    if plan.get("pidfile"):
        with open(plan["pidfile"] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(plan["pidfile"] + ".tmp", plan["pidfile"])
    print("agent: starting")  # not a request: durun passes it through
    outputs = []
    for step in plan["steps"]:
        if "parallel" in step:
            responses = request_all([{"op": "call", "tool": call["call"], "args": call.get("args", {})}
                                     for call in step["parallel"]])
            for response in responses:
                if not response["ok"]:
                    print(f"agent: {response['error']}", file=sys.stderr)
                    sys.exit(3)
                outputs.append(response["output"])
            continue
        if "wait" in step:
            response = request({"op": "wait", "name": step["wait"], "data": step.get("data")})
            if not response["ok"]:
                print(f"agent: {response['error']}", file=sys.stderr)
                sys.exit(3)
            outputs.append({"wait": step["wait"], "data": response["output"]["data"]})
            continue
        if "sleep" in step:
            response = request({"op": "sleep", "seconds": step["sleep"]})
            if not response["ok"]:
                print(f"agent: {response['error']}", file=sys.stderr)
                sys.exit(3)
            outputs.append("slept")
            continue
        if "call" in step:
            response = request({"op": "call", "tool": step["call"], "args": step.get("args", {})})
            if not response["ok"]:
                print(f"agent: {response['error']}", file=sys.stderr)
                sys.exit(3)
            outputs.append(response["output"])
            continue
        opened = request({"op": "begin", "name": step["begin"], "args": step.get("args", {}),
                          "effect": step.get("effect", "read")})
        if not opened["ok"]:
            print(f"agent: {opened['error']}", file=sys.stderr)
            sys.exit(3)
        if opened["replayed"]:
            outputs.append(opened["output"])
            continue
        output, usage = perform(step["do"], step.get("args", {}), opened)
        closed = request({"op": "commit", "step": opened["step"], "output": output, "usage": usage})
        assert closed["ok"], closed
        outputs.append(output)
    request({"op": "result", "output": {"outputs": outputs}})


if __name__ == "__main__":
    main()
