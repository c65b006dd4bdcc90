"""Tools from durun.toml (`call`, `call_all`), and the task's result."""

import json
from typing import Any, Dict, List, Tuple

from ._errors import DurunError, NotUnderDurun, ToolFailed, _ERRORS
from ._values import _encode
from ._process import _checked, _get_channel, active


def _standalone(tool: str, args: Dict[str, Any]) -> Any:
    """A tool outside durun: ``durun call`` runs it from durun.toml, once,
    journaled nowhere."""
    # Imported here: under durun a script never runs `durun call` itself.
    import subprocess

    try:
        done = subprocess.run(["durun", "call", tool, "--json", "--args", json.dumps(args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise NotUnderDurun(f"durun.call({tool!r}) runs the tool through `durun call`, and durun is not on PATH; "
                            "run the script with `durun run -- python3 ...`") from None
    # `--json` answers on stdout whatever happened: the error's code, not
    # the wording of a line on stderr, says what kind it is.
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "ok" not in answer:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise ToolFailed(f"`durun call {tool} --json` gave no answer ({last}); is the durun on PATH older than this SDK?")
    if not answer["ok"]:
        error = answer.get("error") or {}
        errors: Dict[str, "type[DurunError]"] = {**_ERRORS, NotUnderDurun.code: NotUnderDurun}
        raise errors.get(str(error.get("code")), DurunError)(str(error.get("message", "durun call failed")))
    return answer.get("output")


def call(tool: str, **args: Any) -> Any:
    """Runs ``tool`` from durun.toml with ``args`` and returns its output.
    Without durun the tool still runs, once, unjournaled."""
    args = _encode(args, f"the args of tool {tool!r}")
    if not active():
        return _standalone(tool, args)
    return _checked(_get_channel().request({"op": "call", "tool": tool, "args": args})).get("output")


def call_all(calls: List[Tuple[str, Dict[str, Any]]]) -> List[Any]:
    """Runs several tools at once and returns their outputs, in order.

    ``calls`` is a list of ``(tool, args)`` pairs. durun runs the tools
    concurrently and writes the steps that finish together in one commit.
    The steps are numbered in list order, so a resumed run replays them the
    same way. Raises the first failure once every call has answered.
    """
    calls = [(tool, _encode(dict(args), f"the args of tool {tool!r}")) for tool, args in calls]
    if not active():
        return [_standalone(tool, args) for tool, args in calls]
    answers = _get_channel().request_all([{"op": "call", "tool": tool, "args": args} for tool, args in calls])
    for answer in answers:
        _checked(answer)
    return [answer.get("output") for answer in answers]


async def acall(tool: str, **args: Any) -> Any:
    """``call`` for asyncio: the event loop runs on while the tool does."""
    args = _encode(args, f"the args of tool {tool!r}")
    if not active():
        import asyncio  # loaded: the event loop runs (see _channel)

        return await asyncio.get_running_loop().run_in_executor(None, _standalone, tool, args)
    return _checked(await _get_channel().arequest({"op": "call", "tool": tool, "args": args})).get("output")


async def acall_all(calls: List[Tuple[str, Dict[str, Any]]]) -> List[Any]:
    """``call_all`` for asyncio: numbered in list order."""
    calls = [(tool, _encode(dict(args), f"the args of tool {tool!r}")) for tool, args in calls]
    if not active():
        return [await acall(tool, **args) for tool, args in calls]
    answers = await _get_channel().arequest_all([{"op": "call", "tool": tool, "args": args} for tool, args in calls])
    for answer in answers:
        _checked(answer)
    return [answer.get("output") for answer in answers]


def result(value: Any) -> None:
    """Stores the task's final output (shown by ``durun inspect``)."""
    if not active():
        return
    channel = _get_channel()
    channel.settle()
    _checked(channel.request({"op": "result", "output": _encode(value, "the task's result")}))
