"""Streams "slow stream" from OPENAI_BASE_URL with the real `openai`
client; touches FIRST_FILE when the first chunk has arrived, and prints
the whole text."""

import os

import openai

client = openai.OpenAI(api_key="k", max_retries=0)
stream = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "slow stream"}], stream=True)
text = []
for chunk in stream:
    if chunk.choices:
        text.append(chunk.choices[0].delta.content or "")
        if len(text) == 1:
            with open(os.environ["FIRST_FILE"], "w"):
                pass
print("".join(text), flush=True)
