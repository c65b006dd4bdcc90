"""A fake LLM and a fake code-hosting API on loopback, for the examples.

    python3 examples/fake_services.py &        # port 8765, or FAKE_PORT

POST /llm      answers random text with a token `usage`, like a model
POST /pulls    opens a pull request; a repeated Idempotency-Key gets the
               first answer back instead of a second pull request
POST /notify   takes a webhook, deduplicated by Idempotency-Key as well
POST /v1/chat/completions
               an OpenAI-compatible model for agents with tools
               (examples/zero-code): it searches the issues, opens a pull
               request, then answers; counted as LLM calls
GET  /stats    what happened: LLM calls, pull requests, requests per key;
               /stats?task=ID only what a task asked (its requests carry
               `X-Durun-Task: ID`), so examples run one after another
               each count their own
Needs `Authorization: Bearer demo-token` on /pulls.
"""
import json
import os
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"llm_calls": 0, "pulls": [], "notifications": [], "keys": {}, "answers": {}, "tasks": {}}
LOCK = threading.Lock()
WORDS = "plan patch test review branch merge typo docs search refactor".split()


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client killed mid-answer (the demo's crash) is no error here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/stats":
            task = dict(part.partition("=")[::2] for part in query.split("&") if part).get("task")
            with LOCK:
                if task is not None:
                    return self.reply(200, STATE["tasks"].get(task, {"llm_calls": 0, "pulls": 0, "notifications": 0}))
                return self.reply(200, {"llm_calls": STATE["llm_calls"], "pulls": len(STATE["pulls"]),
                                        "notifications": len(STATE["notifications"]), "keys": STATE["keys"]})
        self.reply(404, {"error": "not found"})

    def count(self, what):
        task = self.headers.get("X-Durun-Task")
        if task:
            counts = STATE["tasks"].setdefault(task, {"llm_calls": 0, "pulls": 0, "notifications": 0})
            counts[what] += 1

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        key = self.headers.get("Idempotency-Key", "")
        with LOCK:
            if self.path == "/v1/chat/completions":
                STATE["llm_calls"] += 1
                return self.reply(200, tool_turn(body))
            if self.path == "/llm":
                STATE["llm_calls"] += 1
                self.count("llm_calls")
                text = " ".join(random.sample(WORDS, 5))
                return self.reply(200, {"text": f"{body.get('prompt', '')}: {text}",
                                        "usage": {"input_tokens": 700 + len(str(body)), "output_tokens": 150}})
            if self.path in ("/pulls", "/notify"):
                if self.path == "/pulls" and self.headers.get("Authorization") != "Bearer demo-token":
                    return self.reply(401, {"error": "missing token"})
                STATE["keys"][key] = STATE["keys"].get(key, 0) + 1
                if key and key in STATE["answers"]:
                    return self.reply(200, STATE["answers"][key])
                if self.path == "/pulls":
                    self.count("pulls")
                    STATE["pulls"].append(body)
                    answer = {"number": len(STATE["pulls"]), "url": f"https://git.example/pulls/{len(STATE['pulls'])}"}
                else:
                    self.count("notifications")
                    STATE["notifications"].append(body)
                    answer = {"delivered": True}
                if key:
                    STATE["answers"][key] = answer
                return self.reply(201, answer)
        self.reply(404, {"error": "not found"})


def tool_turn(body):
    """One turn of a model that uses the tools it is offered: a search, a
    pull request, then an answer naming what it opened."""
    offered = {tool["function"]["name"] for tool in body.get("tools", [])}
    plan = [(name, args) for name, args in [("search_issues", {"query": "typo"}),
                                            ("open_pull", {"title": "Fix typo in README"})]
            if name in offered]
    results = [m["content"] for m in body.get("messages", []) if m.get("role") == "tool"]
    if len(results) < len(plan):
        name, args = plan[len(results)]
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{len(results)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": f"Done: {results[-1] if results else 'nothing to do'}"}
        finish = "stop"
    return {"id": "chat-1", "object": "chat.completion", "created": 1, "model": body.get("model", "demo"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960}}


if __name__ == "__main__":
    port = int(os.environ.get("FAKE_PORT", "8765"))
    server = Server(("127.0.0.1", port), Handler)
    print(f"fake services on http://127.0.0.1:{port}", flush=True)
    server.serve_forever()
