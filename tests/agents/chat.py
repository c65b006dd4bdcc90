"""Model calls by plain HTTP, as an agent with no client package makes
them, for the tests' small agents (import it with tests/agents on
PYTHONPATH): `post` a body to a URL, `ask` an OpenAI chat model a
prompt at OPENAI_BASE_URL and get its answer's text."""

import json
import os
import urllib.request


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return urllib.request.urlopen(request).read()


def ask(prompt, model="gpt-4o"):
    answer = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                  {"model": model, "messages": [{"role": "user", "content": prompt}]})
    return json.loads(answer)["choices"][0]["message"]["content"]
