"""An agent that plans, researches, opens a pull request and notifies,
made durable with the durun SDK (pip install ./sdk/python).

    python3 ../fake_services.py &
    durun run -- python3 agent.py

CRASH_IN=research makes the first run die inside that step; `durun resume
TASK` then answers the plan from the journal (no LLM call) and goes on.
"""
import json
import os
import signal
import urllib.request

import durun

LLM = f"http://127.0.0.1:{os.environ.get('FAKE_PORT', '8765')}/llm"


@durun.step("llm")
def ask(prompt: str) -> str:
    if os.environ.get("CRASH_IN") == prompt.split()[0] and os.environ.get("DURUN_RUN") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    request = urllib.request.Request(LLM, data=json.dumps({"prompt": prompt}).encode(), method="POST",
                                     headers={"X-Durun-Task": os.environ.get("DURUN_TASK_ID", "")})
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.loads(reply.read())
    durun.usage(**answer["usage"])
    return str(answer["text"])


plan = ask("plan a fix for the typo in README.md")
research = ask("research where the typo is")
pull = durun.call("open_pull", title="Fix typo in README", body=f"{plan}\n\n{research}")
durun.call("notify", channel="#dev", text=f"opened {pull['url']}")
durun.result({"pull": pull["url"], "plan": plan})
print(f"agent: opened {pull['url']}")
