"""An MCP client without an SDK, for the torture of `durun mcp`: it starts
`durun mcp -- python3 plain_mcp_server.py CALLS` itself (its pid in
PIDFILE), makes N `echo` calls one after another, each with the argument
`{"title": "cI"}`, and prints the texts it got as one JSON list. If
`durun mcp` goes away or answers a call with an error, it says so on
stderr and exits 3.

usage: mcp_caller.py N CALLS PIDFILE"""
import json
import os
import subprocess
import sys

n, calls, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_mcp_server.py")
mcp = subprocess.Popen(
    [os.environ.get("DURUN_BIN", "durun"), "mcp", "--", sys.executable, server, calls],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
with open(pidfile + ".tmp", "w") as out:
    out.write(str(mcp.pid))
os.rename(pidfile + ".tmp", pidfile)


def send(message):
    try:
        mcp.stdin.write(json.dumps(message) + "\n")
        mcp.stdin.flush()
    except BrokenPipeError:
        fail("durun mcp went away")


def fail(why):
    print(f"mcp_caller: {why}", file=sys.stderr, flush=True)
    os._exit(3)


def request(id, method, params):
    send({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    for line in mcp.stdout:
        message = json.loads(line)
        if message.get("id") != id:
            continue
        if "error" in message:
            fail(f"{method} {params}: {message['error']}")
        return message["result"]
    fail(f"durun mcp ended during {method}")


request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "mcp_caller", "version": "1"}})
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
request(2, "tools/list", {})
got = []
for i in range(n):
    result = request(10 + i, "tools/call", {"name": "echo", "arguments": {"title": f"c{i}"}})
    got.append(result["content"][0]["text"])
print(json.dumps(got), flush=True)
mcp.stdin.close()
mcp.wait()
