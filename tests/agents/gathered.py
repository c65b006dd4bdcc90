"""Three model steps gathered at once through the Python SDK (asyncio),
each a POST to LLM_URL whose answer reports token usage. On its first run
the agent kills durun with SIGKILL the moment `gather` returns (the
harshest point for a commit that was only posted), then waits to die with
it. Every answer the agent had must be in the journal: on resume none of
the three calls is sent again."""

import asyncio
import json
import os
import signal
import time
import urllib.request

import durun


def post(prompt):
    request = urllib.request.Request(os.environ["LLM_URL"], data=json.dumps({"prompt": prompt}).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def asking(prompt):
    async def ask():
        return await asyncio.to_thread(post, prompt)
    return ask


async def main():
    answers = await asyncio.gather(*[
        durun.step(f"model {part}", {"prompt": part}, asking(part))
        for part in ("a", "b", "c")])
    if os.environ.get("DURUN_RUN") == "1":
        os.kill(int(os.environ["DURUN_PID"]), signal.SIGKILL)
        time.sleep(30)
    with open(os.environ["ANSWERS_FILE"], "w") as out:
        json.dump([answer["text"] for answer in answers], out)


asyncio.run(main())
