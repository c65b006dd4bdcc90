"""A FastMCP server (the official `mcp` Python SDK) whose `create_issue`
applies its effect once per idempotency key, across restarts: each key
applied is a JSON line in APPLIED_FILE, written before the tool answers,
and a call with a key already there answers that issue without applying
anything. The tool then holds while HOLD_FILE does not exist (where a test
breaks something) and writes HOLD_FILE.reached. The count of effects is
the count of lines:

    mcp_task_server.py stdio APPLIED_FILE [HOLD_FILE]
    mcp_task_server.py http PORT_FILE APPLIED_FILE [HOLD_FILE]"""

import json
import os
import sys
import time

from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("tracker")
args = sys.argv[2:] if sys.argv[1] == "stdio" else sys.argv[3:]
applied_file = args[0]
hold_file = args[1] if len(args) > 1 else None


def applied():
    try:
        with open(applied_file) as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except FileNotFoundError:
        return []


@server.tool()
def create_issue(title: str, ctx: Context) -> str:
    """Creates an issue, once per idempotency key."""
    meta = ctx.request_context.meta
    key = ((meta.model_extra or {}) if meta is not None else {}).get("io.durun/idempotency-key")
    for done in applied():
        if done["key"] == key:
            return done["issue"]
    issue = f"issue-{len(applied()) + 1}"
    with open(applied_file, "a") as out:
        out.write(json.dumps({"key": key, "title": title, "issue": issue}) + "\n")
    if hold_file and not os.path.exists(hold_file):
        with open(hold_file + ".reached", "w"):
            pass
        while not os.path.exists(hold_file):
            time.sleep(0.02)
    return issue


if sys.argv[1] == "http":
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server.settings.port = port
    server.settings.host = "127.0.0.1"
    with open(sys.argv[2] + ".tmp", "w") as out:
        out.write(str(port))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    server.run(transport="streamable-http")
else:
    server.run()
