"""A bare MCP server on stdio, no SDK: one JSON-RPC message a line. It
answers `initialize`, `tools/list` and `tools/call` (each call is appended
to the file in argv[1] before it is answered, and a batch is answered as a
batch). Tools: `echo` answers at once, `slow` after half a second, `die`
exits with code 3 without answering."""
import json
import sys
import time

calls = sys.argv[1]


def answer(message):
    method = message.get("method")
    if "id" not in message:
        return None
    if method == "initialize":
        return {"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "plain", "version": "1"}}}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
            {"name": name, "inputSchema": {"type": "object"}} for name in ("echo", "slow", "die")]}}
    if method == "tools/call":
        params = message["params"]
        with open(calls, "a") as out:
            out.write(json.dumps({"id": message["id"], "name": params["name"],
                                  "key": params.get("_meta", {}).get("io.durun/idempotency-key")}) + "\n")
        if params["name"] == "die":
            sys.exit(3)
        if params["name"] == "slow":
            time.sleep(0.5)
        text = json.dumps(params.get("arguments", {}))
        return {"jsonrpc": "2.0", "id": message["id"], "result": {"content": [{"type": "text", "text": text}]}}
    return {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no such method"}}


for line in sys.stdin:
    if not line.strip():
        continue
    message = json.loads(line)
    if isinstance(message, list):
        answers = [a for a in (answer(m) for m in message) if a is not None]
        if answers:
            print(json.dumps(answers), flush=True)
    else:
        reply = answer(message)
        if reply is not None:
            print(json.dumps(reply), flush=True)
