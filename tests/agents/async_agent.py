"""An asyncio agent on the real `openai` and `anthropic` clients, wrapped
by durun: a plan, three calls at once with asyncio.gather, a stream, the
Responses API, an Anthropic message and stream, then a `mutate` step that
holds until a file exists (where the test kills durun)."""

import asyncio
import os
import sys

import anthropic
import openai

import durun

base = os.environ["LLM_BASE"]
hold_file = os.environ["HOLD_FILE"]


# A `mutate` step: its begin is answered once its intent is durable, and so
# (durun's order rule) every commit the SDK posted before it. The test kills
# durun here with all eight model calls recorded.
@durun.step("hold", effect="mutate")
async def hold():
    with open(os.environ["HOLDING_FILE"], "w"):
        pass
    while not os.path.exists(hold_file):
        await asyncio.sleep(0.02)
    return "held"


class Agent:
    def __init__(self):
        self.client = durun.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0))
        self.claude = durun.wrap(anthropic.AsyncAnthropic(base_url=base, api_key="k", max_retries=0))

    @durun.step("summarize", args=lambda texts: {"texts": texts})
    async def summarize(self, texts):
        return " | ".join(texts)

    async def ask(self, prompt):
        reply = await self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content

    async def main(self):
        plan = await self.ask("plan")
        parts = await asyncio.gather(self.ask("part a"), self.ask("part b"), self.ask("part c"))
        stream = await self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "stream"}], stream=True,
            stream_options={"include_usage": True})
        streamed = "".join([chunk.choices[0].delta.content async for chunk in stream if chunk.choices])
        response = await self.client.responses.create(model="m", input="respond")
        message = await self.claude.messages.create(
            model="c", max_tokens=10, messages=[{"role": "user", "content": "claude"}])
        claude_stream = await self.claude.messages.create(
            model="c", max_tokens=10, messages=[{"role": "user", "content": "claude stream"}], stream=True)
        claude_streamed = "".join([event.delta.text async for event in claude_stream
                                   if event.type == "content_block_delta"])
        await hold()
        summary = await self.summarize([plan, *parts, streamed.strip(), response.output_text,
                                        message.content[0].text, claude_streamed])
        durun.result({"summary": summary, "when": durun.now().isoformat(), "id": durun.uuid()})
        print("agent done", file=sys.stderr)


asyncio.run(Agent().main())
