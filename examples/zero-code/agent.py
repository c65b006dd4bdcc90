"""An agent on the OpenAI Agents SDK that has never heard of durun: a
model from OPENAI_BASE_URL, and an MCP server (tracker.py) started the way
any MCP server is, with `durun mcp --` in front of its command. Nothing
here imports durun.

    pip install openai-agents "mcp<2"
    python3 ../fake_services.py &
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=demo durun run -- python3 agent.py

CRASH_IN=open_pull makes the first run die (SIGKILL) right after the pull
request is opened, before its answer comes back; `durun resume TASK` then
replays the model's turns and the search from the journal and sends the
pull request again with the same idempotency key: one pull request.
"""
import asyncio
import os

from agents import Agent, Runner, set_default_openai_api, set_tracing_disabled
from agents.mcp import MCPServerStdio

set_default_openai_api("chat_completions")
set_tracing_disabled(True)  # no traces sent to OpenAI's servers


async def main() -> None:
    server = ["python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "tracker.py"),
              "--port", os.environ.get("FAKE_PORT", "8765")]
    if os.environ.get("CRASH_IN") == "open_pull" and os.environ.get("DURUN_RUN") == "1":
        server.append("--crash-after-open")
    async with MCPServerStdio(params={"command": "durun", "args": ["mcp", "--", *server]},
                              client_session_timeout_seconds=60) as tracker:
        agent = Agent(name="fixer", model="demo-model", mcp_servers=[tracker],
                      instructions="Find the typo issue and open a pull request that fixes it.")
        result = await Runner.run(agent, "Fix the typo in the README.")
        print(result.final_output, flush=True)


asyncio.run(main())
