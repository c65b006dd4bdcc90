"""An Agents SDK agent whose function tools run inside its own process,
where no proxy sees them: `note_plain` as written, `note_journaled` with
the one line that makes it a durun step. Each appends to NOTES; the third
tool kills the first run. On resume the model's turns replay from the
journal and the agent calls its tools again: the plain one writes again,
the journaled one is answered from the journal."""

import asyncio
import os

from agents import Agent, Runner, function_tool, set_default_openai_api, set_tracing_disabled

import durun

set_default_openai_api("chat_completions")
set_tracing_disabled(True)
notes = os.environ["NOTES"]


@function_tool
def note_plain(text: str) -> str:
    """Writes a note."""
    with open(notes, "a") as out:
        out.write(text + "\n")
    return "noted"


@function_tool
@durun.step("note_journaled", effect="mutate")
def note_journaled(text: str) -> str:
    """Writes a note, as a journaled step."""
    with open(notes, "a") as out:
        out.write(text + "\n")
    return "noted"


@function_tool
def crash_once() -> str:
    """Dies the first run."""
    if os.environ.get("DURUN_RUN") == "1":
        os._exit(3)
    return "alive"


async def main():
    agent = Agent(name="notes", instructions="Take notes.", model="m",
                  tools=[note_plain, note_journaled, crash_once])
    result = await Runner.run(agent, "Take the notes.")
    print(result.final_output, flush=True)


asyncio.run(main())
