"""A low-level MCP server (the official `mcp` Python SDK) with the SDK's own
task support enabled: `create_issue` called as a task runs as the server's
task (it takes 0.3 s); called plainly, it answers at once. Each call is a
JSON line in CALLS_FILE: the idempotency key durun sent, and whether it
came as a task.

    mcp_native_task_server.py CALLS_FILE"""

import json
import sys

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

server = Server("tracker")
server.experimental.enable_tasks()
calls_file = sys.argv[1]


@server.list_tools()
async def list_tools():
    return [
        types.Tool(
            name="create_issue",
            description="Creates an issue.",
            inputSchema={"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
            execution=types.ToolExecution(taskSupport="optional"),
        )
    ]


@server.call_tool()
async def call_tool(name, arguments):
    ctx = server.request_context
    meta = ctx.meta
    key = ((meta.model_extra or {}) if meta is not None else {}).get("io.durun/idempotency-key")
    as_task = ctx.experimental.is_task
    with open(calls_file, "a") as out:
        out.write(json.dumps({"key": key, "as_task": as_task}) + "\n")
    result = types.CallToolResult(content=[types.TextContent(type="text", text=f"issue for {arguments['title']}")])
    if not as_task:
        return result

    async def work(task):
        await anyio.sleep(0.3)
        return result

    return await ctx.experimental.run_task(work)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
