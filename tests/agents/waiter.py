"""An SDK agent for the waiting tests: runs the actions of a JSON plan
(argv[1]) and records each step body that runs in $WAITER_LOG."""

import json
import os
import sys
import time

import durun

plan = json.load(open(sys.argv[1]))
log = os.environ["WAITER_LOG"]


def ran(name, tokens=0):
    with open(log, "a") as out:
        out.write(name + "\n")
    value = {"step": name}
    if tokens:
        value["usage"] = {"input_tokens": tokens, "output_tokens": 0}
    return value


def hold(path):
    with open(log, "a") as out:
        out.write("hold\n")
    while not os.path.exists(path):
        time.sleep(0.02)
    return "held"


results = []
for action in plan:
    if "step" in action:
        name = action["step"]
        results.append(durun.step(name, {"name": name}, lambda: ran(name, action.get("tokens", 0)),
                                  effect=action.get("effect", "read")))
    elif "hold" in action:
        results.append(durun.step("hold", {}, lambda: hold(action["hold"]), effect="mutate"))
    elif "wait" in action:
        try:
            results.append(durun.wait(action["wait"], action.get("data"), action.get("timeout")))
        except durun.Timeout as exc:
            results.append({"timeout": str(exc)})
    elif "approval" in action:
        results.append(durun.approval(action["approval"]))
    elif "sleep" in action:
        durun.sleep(action["sleep"])
        results.append("slept")
durun.result(results)
