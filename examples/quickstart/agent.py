"""A small agent made durable by durun, speaking its JSON-lines protocol.

    durun run -- python3 agent.py

It plans with an "LLM" (simulated here: slow, and different every time, as
a real model is), reads the files it finds through a durun tool, asks the
"LLM" for a summary, and writes a report through a `mutate` tool, into
$REPORT_DIR (the system's temp directory unless set), never into this
folder. Set
CRASH_IN=llm.summarize to make it die inside that step, then
`durun resume TASK`: the steps before it come back from the journal, with
no LLM call.
"""
import json
import os
import random
import signal
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Tuple

# Requests go to durun on stdout, answers come back on stdin. Send the
# agent's own prints to stderr so they can never mix with a request.
protocol_out = sys.stdout
sys.stdout = sys.stderr
_ids = iter(range(1, 1_000_000))


def request(message: Dict[str, Any]) -> Dict[str, Any]:
    message["id"] = next(_ids)
    protocol_out.write(json.dumps(message) + "\n")
    protocol_out.flush()
    answer: Dict[str, Any] = json.loads(sys.stdin.readline())
    if not answer["ok"]:
        raise RuntimeError(f"durun: {answer['error']['code']}: {answer['error']['message']}")
    return answer


def step(name: str, args: Dict[str, Any], run: Callable[[], Tuple[Any, Dict[str, int]]],
         effect: str = "read") -> Any:
    """Runs `run()` as journaled step `name`, unless the journal has it."""
    opened = request({"op": "begin", "name": name, "args": args, "effect": effect})
    if opened["replayed"]:
        print(f"  step {opened['step']} {name}: from the journal")
        return opened["output"]
    if os.environ.get("CRASH_IN") == name and os.environ.get("DURUN_RUN") == "1":
        print(f"  step {opened['step']} {name}: crashing on purpose (CRASH_IN)")
        os.kill(os.getpid(), signal.SIGKILL)
    output, usage = run()
    request({"op": "commit", "step": opened["step"], "output": output, "usage": usage})
    return output


def call(tool: str, **args: Any) -> Any:
    return request({"op": "call", "tool": tool, "args": args})["output"]


def fake_llm(prompt: str) -> Tuple[str, Dict[str, int]]:
    """Stands in for a model call: slow, costly, never twice the same."""
    time.sleep(0.3)
    words = random.sample(["plan", "read", "files", "summary", "risk", "notes", "todo", "check"], 5)
    text = f"{prompt}: " + " ".join(words)
    return text, {"input_tokens": 500 + len(prompt), "output_tokens": 120}


def main() -> None:
    print(f"agent: task {os.environ.get('DURUN_TASK_ID')}, run {os.environ.get('DURUN_RUN')}")
    plan = step("llm.plan", {"prompt": "plan a report on this folder"},
                lambda: fake_llm("plan"))
    listing = call("list_files", dir=".")
    files = sorted(name for name in listing.split() if name.endswith((".py", ".toml", ".md")))
    sizes = {name: call("word_count", path=name).split()[0] for name in files}
    summary = step("llm.summarize", {"prompt": "summarize", "sizes": sizes},
                   lambda: fake_llm("summary"))
    report = f"# Report\n\nPlan: {plan}\n\nSummary: {summary}\n\nWords: {json.dumps(sizes)}\n"
    # Outside the folder it reads: a second run lists the same files.
    folder = os.environ.get("REPORT_DIR", tempfile.gettempdir())
    path = os.path.join(folder, f"durun-report-{os.environ.get('DURUN_TASK_ID')}.md")
    written = call("write_report", path=path, text=report)
    request({"op": "result", "output": {"report": written, "files": len(files)}})
    print(f"agent: wrote {written['path']} ({written['bytes']} bytes)")


if __name__ == "__main__":
    main()
