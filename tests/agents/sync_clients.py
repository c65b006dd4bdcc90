"""The sync `openai` and `anthropic` clients wrapped by durun: a chat
completion, a stream, a Responses API call, an Anthropic message and
stream. Exits 3 on its first run, after every call, so that the resume
must answer them all from the journal."""

import os
import sys

import anthropic
import openai

import durun

base = os.environ["LLM_BASE"]
client = durun.wrap(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0))
claude = durun.wrap(anthropic.Anthropic(base_url=base, api_key="k", max_retries=0))

reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "sync plan"}])
with client.chat.completions.create(model="m", messages=[{"role": "user", "content": "sync stream"}],
                                    stream=True) as stream:
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
response = client.responses.create(model="m", input="sync respond")
message = claude.messages.create(model="c", max_tokens=10, messages=[{"role": "user", "content": "sync claude"}])
events = claude.messages.create(model="c", max_tokens=10, messages=[{"role": "user", "content": "sync claude stream"}],
                                stream=True)
claude_streamed = "".join(event.delta.text for event in events if event.type == "content_block_delta")
# The clients' own types, on the first run and on the replay alike.
from anthropic.types import Message  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402
from openai.types.responses import Response  # noqa: E402

assert isinstance(reply, ChatCompletion), type(reply)
assert isinstance(response, Response), type(response)
assert isinstance(message, Message), type(message)
assert reply.to_json() and message.to_dict()["content"][0]["text"] == message.content[0].text
print("types:", type(reply).__name__, type(response).__name__, type(message).__name__, file=sys.stderr)
if os.environ.get("DURUN_RUN") == "1":
    sys.exit(3)
durun.result([reply.choices[0].message.content, streamed.strip(), response.output_text,
              message.content[0].text, claude_streamed, reply.model_dump()["usage"]["total_tokens"]])
