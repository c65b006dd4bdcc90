"""An MCP server (FastMCP) in front of the fake code-hosting API: a
read-only search, and `open_pull`, which sends durun's idempotency key
(`_meta["io.durun/idempotency-key"]`) as the API's Idempotency-Key, so
that a retry after a crash opens no second pull request.

    tracker.py --port PORT [--crash-after-open]
"""
import json
import os
import signal
import sys
import urllib.request

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

port = sys.argv[sys.argv.index("--port") + 1]
crash_after_open = "--crash-after-open" in sys.argv
server = FastMCP("tracker")


def parent(pid: int) -> int:
    """The parent of process `pid`."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_issues(query: str) -> str:
    """Searches the open issues."""
    return json.dumps([{"number": 7, "title": f"Typo in README ({query})"}])


@server.tool()
def open_pull(title: str, ctx: Context) -> str:
    """Opens a pull request."""
    meta = ctx.request_context.meta
    key = ((meta.model_extra or {}) if meta is not None else {}).get("io.durun/idempotency-key", "")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/pulls", data=json.dumps({"title": title}).encode(), method="POST",
        headers={"Authorization": "Bearer demo-token", "Idempotency-Key": key,
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        pull = json.loads(reply.read())
    if crash_after_open:
        # The pull request exists; its answer never reaches the journal:
        # `durun mcp` (this server's parent) and the agent above it die as
        # in an OOM kill.
        # This server's parent is the keeper `durun mcp` runs it under.
        # The relay is stopped first: once it dies, its keeper ends this
        # server at once, and the agent must already be on its way out
        # (the run's containment then ends the stopped relay, if this
        # server does not get to).
        relay = parent(os.getppid())
        agent = parent(relay)
        os.kill(relay, signal.SIGSTOP)
        os.kill(agent, signal.SIGKILL)
        os.kill(relay, signal.SIGKILL)
    return pull["url"]


server.run()
