"""An MCP client of `durun mcp-server`, with the official Python SDK:
lists the tools, then makes each call of the JSON list in argv[1] in
turn ({"tool", "arguments", "then": durun's arguments}) and, right after
each, runs `durun THEN` itself; prints the tools and, for each call, its
structured content, whether it is an error, its text, and what the
command printed (as JSON). With MCP_URL and MCP_TOKEN, it talks to
`durun mcp-server --listen` on the streamable HTTP transport instead of
starting `durun mcp-server` on stdio. A call with "background" is sent
and awaited only after the calls that follow it; a call with "touch"
creates that file once answered."""

import asyncio
import json
import os
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

calls = json.load(open(sys.argv[1]))


def direct(args):
    done = subprocess.run(["durun"] + args, capture_output=True, text=True)
    return json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}


def transport():
    if "MCP_URL" in os.environ:
        return streamablehttp_client(os.environ["MCP_URL"],
                                     headers={"Authorization": "Bearer " + os.environ["MCP_TOKEN"]})
    return stdio_client(StdioServerParameters(command="durun", args=["mcp-server"], env=dict(os.environ)))


async def main():
    async with transport() as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            started = await session.initialize()
            tools = await session.list_tools()
            results = []
            background = []

            def record(call, result):
                results.append({
                    "structured": result.structuredContent,
                    "is_error": result.isError,
                    "text": [content.text for content in result.content],
                    "direct": direct(call["then"]) if call.get("then") else None,
                })

            for call in calls:
                if call.get("background"):
                    # Sent now, awaited after the calls that follow.
                    background.append((call, asyncio.create_task(session.call_tool(call["tool"], call["arguments"]))))
                    await asyncio.sleep(0.2)
                    continue
                record(call, await session.call_tool(call["tool"], call["arguments"]))
                if call.get("touch"):
                    open(call["touch"], "w").close()
            for call, pending in background:
                record(call, await pending)
            print(json.dumps({
                "server": started.serverInfo.name,
                "tools": [tool.model_dump(mode="json", exclude_none=True) for tool in tools.tools],
                "results": results,
            }))


asyncio.run(asyncio.wait_for(main(), 120))
