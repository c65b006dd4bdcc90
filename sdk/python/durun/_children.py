"""Sub-agents: child tasks spawned as steps, joined as waits."""

import json
import os
from typing import Any, Dict, List, Optional, Sequence, cast

from ._errors import NotUnderDurun
from ._values import _encode
from ._process import _checked, _get_channel, active


def _spawn_request(name: str, command: Sequence[str], args: Any, queue: Optional[str]) -> Dict[str, Any]:
    if isinstance(command, str) or not command or not all(isinstance(word, str) for word in command):
        raise ValueError("durun.spawn() takes the child's argv as a list of strings, e.g. ['python3', 'research.py']")
    request: Dict[str, Any] = {
        "op": "spawn", "name": name, "command": list(command),
        "args": _encode(args, f"the args of spawn {name!r}"),
    }
    if queue is not None:
        request["queue"] = queue
    return request


def _join_request(task: str, timeout: Any) -> Dict[str, Any]:
    request: Dict[str, Any] = {"op": "join", "task": task}
    if timeout is not None:
        request["timeout"] = timeout if isinstance(timeout, str) else float(timeout)
    return request


def _needs_durun(what: str) -> None:
    if not active():
        raise NotUnderDurun(f"durun.{what} needs durun: run the script with `durun run -- python3 ...`")


def spawn(name: str, command: Sequence[str], args: Any = None, queue: Optional[str] = None) -> str:
    """Starts a child task and returns its id (``PARENT-sN``: a replay or a
    retry never makes a second child). The child runs ``command`` in this
    task's directory, with ``args`` in its ``durun.args()``; on ``queue``
    a worker runs it, without one durun runs it beside this agent."""
    _needs_durun(f"spawn({name!r})")
    answer = _checked(_get_channel().request(_spawn_request(name, command, args, queue)))
    return cast(str, answer["output"]["task"])


def join(task: str, timeout: Any = None) -> Dict[str, Any]:
    """Waits for child ``task`` to end and returns ``{"task", "status",
    "output"}``; status is ``completed``, ``failed`` or ``cancelled`` (a
    child's failure is data, not an exception). A long wait parks this
    task (exit 77) until the child has ended."""
    _needs_durun(f"join({task!r})")
    return cast(Dict[str, Any], _checked(_get_channel().request(_join_request(task, timeout)))["output"])


def join_all(tasks: Sequence[str], timeout: Any = None) -> List[Dict[str, Any]]:
    """``join`` each child, in order; the results in the same order."""
    return [join(task, timeout) for task in tasks]


async def aspawn(name: str, command: Sequence[str], args: Any = None, queue: Optional[str] = None) -> str:
    """``spawn`` for asyncio."""
    _needs_durun(f"aspawn({name!r})")
    answer = _checked(await _get_channel().arequest(_spawn_request(name, command, args, queue)))
    return cast(str, answer["output"]["task"])


async def ajoin(task: str, timeout: Any = None) -> Dict[str, Any]:
    """``join`` for asyncio."""
    _needs_durun(f"ajoin({task!r})")
    answer = _checked(await _get_channel().arequest(_join_request(task, timeout)))
    return cast(Dict[str, Any], answer["output"])


async def ajoin_all(tasks: Sequence[str], timeout: Any = None) -> List[Dict[str, Any]]:
    """``join`` several children at once, for asyncio."""
    import asyncio  # loaded: the event loop runs (see _channel)

    return list(await asyncio.gather(*(ajoin(task, timeout) for task in tasks)))


def args() -> Any:
    """In a child task: the ``args`` its parent spawned it with (``None``
    elsewhere)."""
    text = os.environ.get("DURUN_ARGS")
    return None if text is None else json.loads(text)


def parent() -> Optional[str]:
    """In a child task: its parent's id (``None`` elsewhere)."""
    return os.environ.get("DURUN_PARENT_TASK")
