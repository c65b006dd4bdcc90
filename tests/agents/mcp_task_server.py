"""A FastMCP server (the official `mcp` Python SDK) whose `create_issue`
applies its effect once per idempotency key, across restarts: each key
applied is a JSON line in APPLIED_FILE, written before the tool answers,
and a call with a key already there answers that issue without applying
anything. The tool then holds while HOLD_FILE does not exist (where a test
breaks something) and writes its pid to HOLD_FILE.reached; with `before`, it holds
before it applies anything. The count of effects is the count of lines;
every call of `create_issue` is a line in APPLIED_FILE.calls.
`issue_by_key` is the probe: the issue a key made, or an error.

    mcp_task_server.py stdio APPLIED_FILE [HOLD_FILE [before]]
    mcp_task_server.py http PORT_FILE APPLIED_FILE [HOLD_FILE]"""

import json
import os
import sys
import time

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("tracker")
args = sys.argv[2:] if sys.argv[1] == "stdio" else sys.argv[3:]
applied_file = args[0]
hold_file = args[1] if len(args) > 1 else None
hold_before = args[2:] == ["before"]


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
    with open(applied_file + ".calls", "a") as out:
        out.write(json.dumps({"key": key}) + "\n")
    if hold_before:
        hold()
    for done in applied():
        if done["key"] == key:
            return done["issue"]
    issue = f"issue-{len(applied()) + 1}"
    with open(applied_file, "a") as out:
        out.write(json.dumps({"key": key, "title": title, "issue": issue}) + "\n")
    hold()
    return issue


def hold():
    if hold_file and not os.path.exists(hold_file):
        # Its pid, for a test that waits for this process to be gone.
        with open(hold_file + ".reached.tmp", "w") as out:
            out.write(str(os.getpid()))
        os.rename(hold_file + ".reached.tmp", hold_file + ".reached")
        while not os.path.exists(hold_file):
            time.sleep(0.02)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def issue_by_key(idempotency_key: str) -> str:
    """The issue a key made: the probe of create_issue."""
    for done in applied():
        if done["key"] == idempotency_key:
            return done["issue"]
    raise ValueError(f"no issue was made with key {idempotency_key}")


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
