"""An agent for the tests of `durun test`, right or wrong on purpose. It
asks a model (plain HTTP to $OPENAI_BASE_URL, the proxy under durun),
reads two things, and creates a resource through the `create` tool
(mutate). MISTAKE makes it wrong in one classic way:

    outside    a side effect outside any step: a line appended to
               $DURUN_TEST_SCRATCH/world.txt on every start
    clock      the prompt holds time.time(), taken outside any step
    set_order  steps named in a set's iteration order (which changes with
               each process's hash seed)
    no_retry   no retry of a failed model call (--fault finds it)

With RETRY_CALLS set it tries a failed tool call up to three times.

The `create` tool (create.py) deduplicates by its idempotency key unless
NO_DEDUPE is set."""

import json
import os
import sys
import time
import urllib.error
import urllib.request

protocol_out = sys.stdout
sys.stdout = sys.stderr
mistake = os.environ.get("MISTAKE", "")
ids = iter(range(1, 1_000_000))


def request(message, check=True):
    message["id"] = next(ids)
    protocol_out.write(json.dumps(message) + "\n")
    protocol_out.flush()
    answer = json.loads(sys.stdin.readline())
    if check and not answer["ok"]:
        raise SystemExit(f"agent: {answer['error']['message']}")
    return answer


def call(tool, args):
    tries = 3 if os.environ.get("RETRY_CALLS") else 1
    for attempt in range(tries):
        answer = request({"op": "call", "tool": tool, "args": args}, check=attempt + 1 == tries)
        if answer["ok"]:
            return answer["output"]


def step(name, args, run):
    opened = request({"op": "begin", "name": name, "args": args, "effect": "read"})
    if opened["replayed"]:
        return opened["output"]
    output = run()
    request({"op": "commit", "step": opened["step"], "output": output})
    return output


def ask(prompt):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode()
    tries = 1 if mistake == "no_retry" else 3
    for attempt in range(tries):
        try:
            req = urllib.request.Request(
                os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                headers={"content-type": "application/json", "authorization": "Bearer sk-test"})
            with urllib.request.urlopen(req, timeout=30) as answer:
                return json.load(answer)["choices"][0]["message"]["content"]
        except (urllib.error.HTTPError, urllib.error.URLError, ConnectionError) as err:
            if attempt + 1 == tries:
                raise SystemExit(f"agent: the model call failed: {err}")
            time.sleep(0.05)


def main():
    if mistake == "outside":
        with open(os.path.join(os.environ.get("DURUN_TEST_SCRATCH", "."), "world.txt"), "a") as out:
            out.write("started\n")
    prompt = "plan the work"
    if mistake == "clock":
        prompt += f" (asked at {time.time()})"
    plan = ask(prompt)
    names = {"alpha", "beta", "gamma", "delta", "epsilon"} if mistake == "set_order" else ["alpha", "beta"]
    read = [step(f"read {name}", {}, lambda name=name: f"{name} read") for name in names]
    made = call("create", {"title": plan})
    request({"op": "result", "output": {"plan": plan, "read": len(read), "made": made}})
    print(f"agent: made {made}")


main()
