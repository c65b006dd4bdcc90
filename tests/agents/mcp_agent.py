"""An agent that uses an MCP server through the official `mcp` client,
configured as any client is: the server's command with `durun mcp --` in
front (MCP_SERVER, a JSON argv), or its URL (MCP_URL) behind `durun mcp
--url`. It lists the tools, makes the calls in MCP_CALLS (JSON, [[tool,
arguments], …]; by default it looks a topic up and creates an issue) and
prints what it got."""

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
    # The SDK's default environment for the server: HOME, PATH and a few
    # more, not DURUN_SOCKET. durun mcp finds its run anyway.
    params = StdioServerParameters(command=durun, args=args)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            names = sorted(tool.name for tool in tools.tools)
            calls = json.loads(os.environ.get("MCP_CALLS") or
                               '[["lookup", {"topic": "crashes"}], ["create_issue", {"title": "agent crashed"}]]')
            got = []
            for tool, arguments in calls:
                result = await session.call_tool(tool, arguments)
                got.append([block.text for block in result.content if block.type == "text"])
            print(json.dumps({"tools": names, "got": got}), flush=True)


asyncio.run(main())
