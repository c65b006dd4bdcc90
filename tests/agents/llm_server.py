"""A fake OpenAI and Anthropic API on loopback, for the real client
packages: chat completions (and their SSE stream), responses, messages
(and their SSE stream). usage: llm_server.py PORT_FILE [CERT KEY]

Every request is counted by path and first prompt in PORT_FILE.count
(JSON), so a test can tell whether a request was sent twice. With CERT
KEY after PORT_FILE it serves HTTPS."""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port_file = sys.argv[1]
counts = {}
lock = threading.Lock()


def prompt_of(body):
    if "messages" in body:
        content = body["messages"][-1]["content"]
        return content if isinstance(content, str) else json.dumps(content)
    return str(body.get("input"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, value):
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events):
        body = "".join(
            (f"event: {name}\n" if name else "") + f"data: {json.dumps(data) if not isinstance(data, str) else data}\n\n"
            for name, data in events).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # An agent's loop: the model calls these tools one after another (those
    # the request offers), then answers with what they returned.
    TOOL_PLAN = [("add", {"a": 2, "b": 3}), ("lookup", {"topic": "crashes"}),
                 ("create_issue", {"title": "agent crashed"}),
                 ("note_plain", {"text": "plain"}), ("note_journaled", {"text": "journaled"}),
                 ("crash_once", {})]

    def tool_turn(self, body, model):
        offered = {tool["function"]["name"] for tool in body["tools"]}
        plan = [step for step in self.TOOL_PLAN if step[0] in offered]
        results = [message["content"] for message in body["messages"] if message["role"] == "tool"]
        if len(results) < len(plan):
            name, arguments = plan[len(results)]
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{len(results)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "done: " + " / ".join(map(str, results))}
            finish = "stop"
        return {"id": "t1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}

    def slow_stream(self, model):
        """A chunked stream whose first event comes at once and the rest
        only once PORT_FILE.release exists (or after 30 s): whether the
        agent saw the first event before the end is written to
        PORT_FILE.released."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(data):
            event = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()

        def delta(content, usage=None):
            return json.dumps({"id": "s1", "object": "chat.completion.chunk", "created": 1, "model": model,
                               "choices": [] if usage else [{"index": 0, "delta": {"content": content},
                                                             "finish_reason": None}],
                               **({"usage": usage} if usage else {})})

        chunk(delta("first "))
        released = False
        for _ in range(3000):
            if os.path.exists(port_file + ".release"):
                released = True
                break
            time.sleep(0.01)
        with open(port_file + ".released", "w") as out:
            out.write("yes" if released else "no")
        # The rest a little apart, as a model's tokens come.
        chunk(delta("second"))
        time.sleep(0.05)
        chunk(delta("", {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}))
        time.sleep(0.05)
        chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        prompt = prompt_of(body)
        key = f"{self.path} {prompt}"
        with lock:
            counts[key] = counts.get(key, 0) + 1
            with open(port_file + ".count", "w") as out:
                json.dump(counts, out)
            # When each request came, for the tests of shared limits.
            with open(port_file + ".times", "a") as out:
                out.write(f"{time.time()} {key}\n")
            first = counts[key] == 1
        text = f"echo: {prompt}"
        model = body.get("model", "m")
        if prompt.startswith("sleep "):
            # A slow model: the tests of concurrency limits.
            time.sleep(float(prompt.split()[1]))
        if prompt.startswith("rate limited once") and first:
            # As an API over its rate limit answers: wait a second.
            data = json.dumps({"error": {"type": "rate_limit", "message": "slow down"}}).encode()
            self.send_response(429)
            self.send_header("retry-after", "1")
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if prompt.startswith("status "):
            # An error answer, as an API gives one.
            status = int(prompt.split()[1])
            data = json.dumps({"error": {"type": "fake", "message": f"status {status}"}}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if prompt == "slow stream":
            return self.slow_stream(model)
        if self.path.endswith("/chat/completions") and body.get("tools"):
            return self.send_json(self.tool_turn(body, model))
        if self.path.endswith("/chat/completions") and prompt == "quiet stream":
            # As OpenAI streams: usage only when asked, then `usage: null`
            # on every other chunk and a last chunk with no choices.
            asked = bool((body.get("stream_options") or {}).get("include_usage"))
            nulls = {"usage": None} if asked else {}
            chunks = [("", {"id": "c2", "object": "chat.completion.chunk", "created": 1, "model": model,
                            "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}],
                            **nulls}) for word in text.split()]
            if asked:
                chunks.append(("", {"id": "c2", "object": "chat.completion.chunk", "created": 1, "model": model,
                                    "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 10,
                                                             "total_tokens": 60}}))
            chunks.append(("", "[DONE]"))
            return self.send_events(chunks)
        if self.path.endswith("/chat/completions"):
            if body.get("stream"):
                chunks = [("", {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                                "choices": [{"index": 0, "delta": {"role": "assistant", "content": word + " "},
                                             "finish_reason": None}]}) for word in text.split()]
                chunks.append(("", {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                                    "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 10,
                                                             "total_tokens": 60}}))
                chunks.append(("", "[DONE]"))
                return self.send_events(chunks)
            return self.send_json({
                "id": "c1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})
        if self.path.endswith("/responses"):
            return self.send_json({
                "id": "r1", "object": "response", "created_at": 1, "model": model, "status": "completed",
                "output": [{"type": "message", "id": "m1", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}})
        if self.path.endswith("/messages"):
            message = {"id": "msg1", "type": "message", "role": "assistant", "model": model,
                       "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": {"input_tokens": 40, "output_tokens": 8}}
            if body.get("stream"):
                start = dict(message, content=[], stop_reason=None, usage={"input_tokens": 40, "output_tokens": 1})
                return self.send_events([
                    ("message_start", {"type": "message_start", "message": start}),
                    ("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}}),
                    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": text}}),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                          "stop_sequence": None},
                                       "usage": {"output_tokens": 8}}),
                    ("message_stop", {"type": "message_stop"}),
                ])
            return self.send_json(message)
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client killed mid-answer (the tests kill durun) is expected.
        pass


server = QuietServer(("127.0.0.1", 0), Handler)
if len(sys.argv) > 3:
    # HTTPS with the given certificate and key.
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[2], sys.argv[3])
    server.socket = context.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as out:
    out.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.daemon_threads = True
server.serve_forever()
