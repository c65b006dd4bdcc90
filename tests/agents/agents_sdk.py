"""An agent on the OpenAI Agents SDK (`openai-agents`), unmodified for
durun: a function tool, and an MCP server started through `durun mcp --`
as any MCP server is configured. The model comes from OPENAI_BASE_URL.
usage: agents_sdk.py SERVER_ARGV_JSON"""

import asyncio
import json
import os
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api, set_tracing_disabled
from agents.mcp import MCPServerStdio

# Chat Completions, and no traces sent to OpenAI's servers.
set_default_openai_api("chat_completions")
set_tracing_disabled(True)


@function_tool
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


async def main():
    durun = os.environ.get("DURUN_BIN", "durun")
    server_argv = json.loads(sys.argv[1])
    async with MCPServerStdio(params={"command": durun, "args": ["mcp", "--", *server_argv]},
                              client_session_timeout_seconds=60) as tracker:
        agent = Agent(name="triage", instructions="Triage the crash.", model="m",
                      tools=[add], mcp_servers=[tracker])
        result = await Runner.run(agent, "The nightly job crashed.")
        print(result.final_output, flush=True)


asyncio.run(main())
