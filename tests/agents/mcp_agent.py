"""An agent that uses an MCP server through the official `mcp` client,
configured as any client is: the server's command with `durun mcp --` in
front (MCP_SERVER, a JSON argv), or its URL (MCP_URL) behind `durun mcp
--url`. It lists the tools, makes the calls in MCP_CALLS (JSON, [[tool,
arguments], …]; by default it looks a topic up and creates an issue) and
prints what it got. With MCP_AWAIT_NOTICE set, it then calls `announce`
until the server's `tools/list_changed` notification reaches it (up to 50
times) and prints how many calls that took."""

import asyncio
import json
import os

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    durun = os.environ.get("DURUN_BIN", "durun")
    if os.environ.get("MCP_URL"):
        args = ["mcp", "--url", os.environ["MCP_URL"]]
    else:
        args = ["mcp", "--", *json.loads(os.environ["MCP_SERVER"])]
    if os.environ.get("MCP_NAME"):
        args[1:1] = ["--name", os.environ["MCP_NAME"]]
    # The SDK's default environment for the server: HOME, PATH and a few
    # more, not DURUN_SOCKET. durun mcp finds its run anyway.
    params = StdioServerParameters(command=durun, args=args)
    notices = []

    async def on_message(message):
        if getattr(getattr(message, "root", None), "method", None) == "notifications/tools/list_changed":
            notices.append(message)

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            await session.initialize()
            tools = await session.list_tools()
            names = sorted(tool.name for tool in tools.tools)
            calls = json.loads(os.environ.get("MCP_CALLS") or
                               '[["lookup", {"topic": "crashes"}], ["create_issue", {"title": "agent crashed"}]]')
            got = []
            for tool, arguments in calls:
                result = await session.call_tool(tool, arguments)
                got.append([block.text for block in result.content if block.type == "text"])
            report = {"tools": names, "got": got}
            if os.environ.get("MCP_AWAIT_NOTICE"):
                # The GET stream opens once the session has its id: the
                # first announcements may come before it.
                for attempt in range(1, 51):
                    await session.call_tool("announce", {})
                    await asyncio.sleep(0.1)
                    if notices:
                        report["announced_after"] = attempt
                        break
            print(json.dumps(report), flush=True)


asyncio.run(main())
