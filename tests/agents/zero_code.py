"""An agent that has never heard of durun: the real `openai` and
`anthropic` clients, configured only by OPENAI_BASE_URL and
ANTHROPIC_BASE_URL as usual. Sync and async chat, a stream, the Responses
API, an Anthropic message and stream; then it waits for HOLD_FILE (where a
test kills durun) and prints what the models said."""

import asyncio
import os
import time

import anthropic
import openai


def main():
    client = openai.OpenAI(api_key="sk-test-secret", max_retries=0)
    claude = anthropic.Anthropic(api_key="sk-ant-secret", max_retries=0)

    def ask(prompt):
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content

    said = [ask("plan")]

    async def gathered():
        aclient = openai.AsyncOpenAI(api_key="sk-test-secret", max_retries=0)
        replies = await asyncio.gather(*[
            aclient.chat.completions.create(model="m", messages=[{"role": "user", "content": part}])
            for part in ("part a", "part b")])
        return [reply.choices[0].message.content for reply in replies]

    said += asyncio.run(gathered())
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream"}], stream=True,
        stream_options={"include_usage": True})
    said.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices).strip())
    said.append(client.responses.create(model="m", input="respond").output_text)
    message = claude.messages.create(
        model="c", max_tokens=10, messages=[{"role": "user", "content": "claude"}])
    said.append(message.content[0].text)
    with claude.messages.stream(
            model="c", max_tokens=10, messages=[{"role": "user", "content": "claude stream"}]) as events:
        said.append("".join(events.text_stream))
    hold = os.environ.get("HOLD_FILE")
    if hold:
        with open(hold + ".reached", "w"):
            pass
        while not os.path.exists(hold):
            time.sleep(0.02)
    print(" | ".join(said), flush=True)


main()
