"""The Python SDK's features, one scenario per argv[1], for
tests/integration/sdk_python.rs. Each prints what the test checks as JSON
lines on stderr, prefixed `seen:`."""

import asyncio
import dataclasses
import datetime
import json
import os
import sys

import durun

scenario = sys.argv[1]


def seen(value):
    sys.stderr.write("seen: " + json.dumps(value) + "\n")


class Client:
    """Something no journal can hold: a client, a logger."""


if scenario == "methods":
    class Agent:
        def __init__(self):
            self.client = Client()

        @durun.step("llm")
        def ask(self, prompt, temperature=0):
            return {"text": f"answer to {prompt}", "usage": {"input_tokens": 10, "output_tokens": 5}}

        @durun.step("llm.client", args=lambda prompt, client, **_: {"prompt": prompt})
        def ask_with(self, prompt, client):
            return prompt.upper()

        @classmethod
        @durun.step("cls")
        def make(cls, n):
            return n * 2

    agent = Agent()
    # A function of no arguments in args' place is the step itself.
    thunk = durun.step("thunk", lambda: 40 + 2)
    seen([agent.ask("plan")["text"], agent.ask_with("go", Client()), Agent.make(21), thunk])
    durun.result("ok")

elif scenario == "values":
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    when = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.timezone.utc)
    values = durun.step("values", {}, lambda: {"point": Point(1, 2), "when": when, "pair": (1, 2)})
    seen(values)
    try:
        durun.step("bad.arg", {"client": Client()}, lambda: seen("the bad step ran"))
    except TypeError as exc:
        seen({"arg_error": str(exc)})
    try:
        durun.step("bad.value", {}, lambda: {1, 2})
    except TypeError as exc:
        seen({"value_error": str(exc)})
    try:
        durun.step("lazy", {}, lambda: asyncio.sleep(0))
    except TypeError as exc:
        seen({"awaitable_error": str(exc)})
    durun.result("ok")

elif scenario == "retries":
    attempts = []

    @durun.step("flaky", retries=2, backoff=0.01, effect="mutate")
    def flaky():
        context = durun.current()
        attempts.append([context.attempt, context.idempotency_key])
        if len(attempts) < 3:
            raise RuntimeError(f"attempt {len(attempts)} failed")
        return "third time"

    @durun.step("slow", retries=1, backoff=0.01, timeout=0.2)
    async def slow():
        if durun.current().attempt == 1:
            await asyncio.sleep(5)
        return "fast enough"

    seen(flaky())
    seen(attempts)
    seen(asyncio.run(slow()))
    durun.result("ok")

elif scenario == "async":
    @durun.step("double")
    async def double(n):
        await asyncio.sleep(0.01 * (3 - n))
        return n * 2

    async def main():
        got = await asyncio.gather(double(1), double(2), double(3))
        calls = await durun.acall_all([("echo", {"text": "a"}), ("echo", {"text": "b"})])
        one = await durun.acall("echo", text="c")
        return [got, calls, one]

    seen(asyncio.run(main()))
    durun.result("ok")

elif scenario == "patched":
    # Version 1 of the agent ran `old`; version 2 is patched to run `new`.
    version = int(os.environ["AGENT_VERSION"])
    first = durun.step("first", {}, lambda: "first")
    if version >= 2 and durun.patched("new-step"):
        middle = durun.step("new", {}, lambda: "new")
    else:
        middle = durun.step("old", {}, lambda: "old")
    if os.path.exists(os.environ["STOP_FILE"]):
        os.remove(os.environ["STOP_FILE"])
        sys.exit(3)
    last = durun.step("last", {}, lambda: "last")
    seen([first, middle, last])
    durun.result([first, middle, last])

elif scenario == "deterministic":
    values = [durun.now().isoformat(), durun.random(), durun.uuid()]
    seen(values)
    if os.path.exists(os.environ["STOP_FILE"]):
        os.remove(os.environ["STOP_FILE"])
        sys.exit(3)
    durun.result(values)

elif scenario == "threads":
    # Eight threads and an event loop share the channel at once.
    import threading
    results = []

    def work(k):
        for i in range(100):
            results.append(durun.step("t", {"k": k, "i": i}, lambda: k * 1000 + i))

    async def gathered():
        def one(j):
            async def body():
                await asyncio.sleep(0)
                return j
            return durun.step("a", {"j": j}, body)
        return await asyncio.gather(*[one(j) for j in range(30)])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    got = asyncio.run(gathered())
    for thread in threads:
        thread.join()
    after = [durun.step("after", {"i": i}, lambda: i) for i in range(20)]
    seen([len(results), sorted(results) == sorted(k * 1000 + i for k in range(8) for i in range(100)), got, after[-1]])

elif scenario == "standalone":
    seen([durun.active(), durun.call("echo", text="hi"), durun.step("s", {}, lambda: 7)])
elif scenario in ("refused_next", "refused_exit"):
    import signal
    import time
    # durun stops the run when its journal fails (after it answered the
    # refused commit): stay to hear why.
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    durun.step("a", {}, lambda: 1)
    open(os.environ["READY_FILE"], "w").close()
    while not os.path.exists(os.environ["GO_FILE"]):
        time.sleep(0.01)
    # Its commit is posted; the journal is locked, so durun refuses it.
    seen(durun.step("b", {}, lambda: 2))
    if scenario == "refused_next":
        # The next request goes out once durun has refused the commit and
        # stopped the run, however slow the machine.
        deadline = time.monotonic() + 30
        while not stopped and time.monotonic() < deadline:
            time.sleep(0.01)
        # Short steps post their lines and read durun's answers every so
        # many posts: the refusal is raised by one of the next 64.
        for i in range(1, 201):
            try:
                durun.step("c", {"i": i}, lambda: 3)
            except durun.DurunError as exc:
                seen({"raised": type(exc).__name__, "message": str(exc), "after": i})
                break
        # And by every request from then on, one that waits too.
        try:
            durun.step("d", {}, lambda: 4, "mutate")
        except durun.DurunError as exc:
            seen({"raised": type(exc).__name__, "message": str(exc)})
