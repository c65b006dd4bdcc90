"""The 8-step agent of the crash test, written with the durun SDK."""
import json
import os
import urllib.request

import durun

if os.environ.get("AGENT_PIDFILE"):
    with open(os.environ["AGENT_PIDFILE"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.environ["AGENT_PIDFILE"] + ".tmp", os.environ["AGENT_PIDFILE"])


def post(url, body, headers=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@durun.step("llm")
def llm(prompt):
    answer = post(os.environ["LLM_URL"], {"prompt": prompt})
    durun.usage(**answer["usage"])
    return answer["text"]


@durun.step("create", effect="mutate")
def create(title):
    return post(os.environ["API_URL"], {"title": title}, {"Idempotency-Key": durun.current().idempotency_key})


print("agent: a print goes to stderr and never into the protocol")
outputs = [llm("plan the change"), llm("research the code"), llm("write the patch"), create("Fix typo")]
outputs.append(durun.step("read_note", {"path": "note.txt"}, lambda: open("note.txt").read()))
outputs.append(durun.step("compute", {"n": 6}, lambda: 42))
outputs.append(llm("summarize"))
outputs.append(create("Notify"))
durun.result({"outputs": outputs})
