"""A fake model upstream for the coding-agent CLIs (Claude Code, Codex,
aider, Gemini CLI): Anthropic messages, OpenAI responses and chat
completions, Gemini generateContent, streamed as each CLI asks.
usage: cli_upstream.py STATE_DIR

Each CLI gets the same little session: the model asks for a shell
command twice (`echo durun-1`, `echo durun-2`) when the request offers
a shell tool, or (aider) answers in turns, then says it is done. Every
request is counted by a key that names the request's turn, so a test can
tell whether a finished model call was sent again; `STATE_DIR/requests`
holds the keys in the order they came, and `STATE_DIR/bodies` the
bodies. While `STATE_DIR/hold` exists, a request for a turn after the
second is held (the test kills durun with it in flight)."""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = sys.argv[1]
lock = threading.Lock()
SHELL_TOOLS = ("Bash", "run_shell_command", "shell", "exec_command", "local_shell", "exec")
TURNS = 2


def log(name, line):
    with lock, open(os.path.join(state, name), "a") as out:
        out.write(line + "\n")


def turn_of(body):
    """How many times the model has answered in the conversation, as this
    server answers: the turn the request is at. (Each answer says
    `durun-N`; aider pads the history with its own turns.)"""
    text = json.dumps(body)
    return sum(f"durun-{n}" in text for n in range(1, TURNS + 1))


def offered_tool(body):
    """The shell tool the request offers: by name in `tools` (Codex lists
    its tools in an `additional_tools` input item, nested in namespaces,
    and runs commands through its JavaScript `exec`)."""
    names = set()

    def walk(tools):
        for tool in tools or []:
            names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
            for declaration in tool.get("functionDeclarations") or []:
                names.add(declaration.get("name"))
            walk(tool.get("tools"))

    walk(body.get("tools"))
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            walk(item.get("tools"))
    return next((name for name in SHELL_TOOLS if name in names), None)


def example_of(schema):
    """A value that fits a JSON schema (as Gemini writes it)."""
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        return {name: example_of(value) for name, value in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 10
    if kind == "boolean":
        return False
    return (schema.get("enum") or ["flash"])[0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, kind, data):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def events(self, events):
        body = "".join((f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
                       for name, data in events)
        self.send(200, "text/event-stream", body.encode())

    def do_GET(self):
        # Model lists and the like: an empty answer the CLIs accept.
        self.send(200, "application/json", b'{"data": [], "models": []}')

    def do_HEAD(self):
        self.send(200, "application/json", b"")

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.loads(raw or b"{}")
        tool = offered_tool(body)
        turn = turn_of(body)
        # The model a request names, and whether it asks for JSON, tell a
        # CLI's side calls (titles, routers) from its session's turns.
        model = body.get("model") or self.path.split("/models/")[-1].split(":")[0]
        json_asked = bool((body.get("generationConfig") or {}).get("responseJsonSchema"))
        key = f"{self.path.split('?')[0]} {model} turn {turn}" + (" json" if json_asked else "")
        gemini = ":generateContent" in self.path or ":streamGenerateContent" in self.path
        log("requests", key)
        log("bodies", json.dumps({"key": key, "body": body}))
        if turn >= TURNS and os.path.exists(os.path.join(state, "hold")):
            while os.path.exists(os.path.join(state, "hold")):
                time.sleep(0.05)
        if tool and turn < TURNS:
            command = f"echo durun-{turn + 1}"
            if gemini:
                # Gemini CLI lists the folder in its first message: a
                # command makes a file there, as a coding agent's would,
                # and the resume's first message lists it.
                command += f" && touch made-{turn + 1}.txt"
            text = None
        else:
            command = None
            # aider's `whole` edit format: a file's name, then all of it.
            text = "All done." if turn >= TURNS else f"notes.txt\n```\ndurun-{turn + 1}\n```\n"
        path = self.path.split("?")[0]
        if path.endswith("/messages"):
            return self.anthropic(body, tool, command, text)
        if path.endswith("/responses"):
            return self.openai_responses(body, tool, command, text)
        if path.endswith("/chat/completions"):
            return self.chat(body, tool, command, text)
        if gemini:
            schema = (body.get("generationConfig") or {}).get("responseJsonSchema")
            if schema:
                # Gemini CLI's side calls (its model router) want JSON.
                command, text = None, json.dumps(example_of(schema))
            return self.gemini(tool, command, text)
        if path.endswith("/count_tokens"):
            return self.send(200, "application/json", b'{"input_tokens": 10}')
        self.send(404, "application/json", b'{"error": {"message": "not here"}}')

    def anthropic(self, body, tool, command, text):
        usage = {"input_tokens": 40, "output_tokens": 8}
        if command:
            block = {"type": "tool_use", "id": f"toolu_{command[-1]}", "name": tool, "input": {}}
            delta = {"type": "input_json_delta",
                     "partial_json": json.dumps({"command": command, "description": "Echo"})}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": text}
            stop = "end_turn"
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            whole = dict(block, input={"command": command}) if command else {"type": "text", "text": text}
            return self.send(200, "application/json",
                             json.dumps(dict(message, content=[whole], stop_reason=stop)).encode())
        self.events([
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 8}}),
            ("message_stop", {"type": "message_stop"}),
        ])

    def openai_responses(self, body, tool, command, text):
        if command and tool == "exec":
            # Codex's JavaScript: `text()` is what the call returns.
            item = {"type": "custom_tool_call", "id": f"ctc_{command[-1]}", "call_id": f"call_{command[-1]}",
                    "name": tool, "input": f'text("{command[5:]}")', "status": "completed"}
        elif command:
            arguments = {"command": ["bash", "-lc", command]} if tool in ("shell", "local_shell") \
                else {"cmd": command}
            item = {"type": "function_call", "id": f"fc_{command[-1]}", "call_id": f"call_{command[-1]}",
                    "name": tool, "arguments": json.dumps(arguments), "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        response = {"id": "resp_1", "object": "response", "created_at": 1, "model": body.get("model"),
                    "status": "completed", "output": [item],
                    "usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}
        if not body.get("stream"):
            return self.send(200, "application/json", json.dumps(response).encode())
        created = dict(response, status="in_progress", output=[], usage=None)
        self.events([
            ("response.created", {"type": "response.created", "response": created}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                            "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                           "item": item}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ])

    def chat(self, body, tool, command, text):
        usage = {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
        if command:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{command[-1]}", "type": "function",
                 "function": {"name": tool, "arguments": json.dumps({"command": command})}}]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": text}
            finish = "stop"
        if not body.get("stream"):
            return self.send(200, "application/json", json.dumps({
                "id": "c1", "object": "chat.completion", "created": 1, "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}).encode())
        asked = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body.get("model")}
        events = [("", dict(chunk, choices=[{"index": 0, "delta": message, "finish_reason": finish}]))]
        if asked:
            events.append(("", dict(chunk, choices=[], usage=usage)))
        body_text = "".join(f"data: {json.dumps(data)}\n\n" for _, data in events) + "data: [DONE]\n\n"
        self.send(200, "text/event-stream", body_text.encode())

    def gemini(self, tool, command, text):
        if command:
            part = {"functionCall": {"name": tool, "args": {"command": command}}}
        else:
            part = {"text": text}
        answer = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                                  "index": 0}],
                  "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 7,
                                    "totalTokenCount": 37},
                  "modelVersion": "gemini-2.5-pro"}
        if ":streamGenerateContent" in self.path:
            return self.send(200, "text/event-stream", f"data: {json.dumps(answer)}\n\n".encode())
        self.send(200, "application/json", json.dumps(answer).encode())


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client killed mid-answer (the tests kill durun) is expected.
        pass


server = QuietServer(("127.0.0.1", 0), Handler)
with open(os.path.join(state, "port.tmp"), "w") as out:
    out.write(str(server.server_address[1]))
os.rename(os.path.join(state, "port.tmp"), os.path.join(state, "port"))
server.serve_forever()
