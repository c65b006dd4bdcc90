"""An agent that calls an HTTP API through the URL in MY_API, as it would
without durun: a read (GET), then a POST that creates a resource with its
own Idempotency-Key (durun replaces it with the step's). Prints both
answers."""

import json
import os
import urllib.request

base = os.environ["MY_API"]


def call(method, path, body=None, headers=()):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    for name, value in headers:
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


read = call("GET", "/resources?page=1", headers=[("durun-read", "1")])
created = call("POST", "/resources", {"title": "fix typo"},
               headers=[("Idempotency-Key", "the-agents-own-key"), ("authorization", "Bearer api-secret")])
print(json.dumps({"read": read, "created": created}), flush=True)
