"""PARALLEL (32) chat completions at once with the real `openai` client,
each with its own prompt (PROMPT, else 100 x's, and its number) and
max_tokens 20, to MODEL (gpt-4o-mini).
Prints how many were answered; exits 1 unless all were."""

import os
import sys
import threading

# The client builds its pydantic models at their first use (`defer_build`),
# which is not thread-safe: 32 answers that come back together (replays,
# on resume) can race it into "BaseModel cannot be instantiated directly".
# Built at import instead, by the client's own switch.
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")

import openai  # noqa: E402

count = int(os.environ.get("PARALLEL", "32"))
model = os.environ.get("MODEL", "gpt-4o-mini")
client = openai.OpenAI(api_key="k", max_retries=0)
answered = []


def call(i):
    try:
        client.chat.completions.create(
            model=model, max_tokens=20,
            messages=[{"role": "user", "content": os.environ.get("PROMPT", "x" * 100) + f" call {i}"}])
        answered.append(i)
    except openai.APIError as exc:
        print(f"call {i}: {exc}", file=sys.stderr)


threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(answered), flush=True)
sys.exit(0 if len(answered) == count else 1)
