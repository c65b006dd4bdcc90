"""durun for Python: journaled steps that survive a crash.

Run the script with ``durun run -- python3 agent.py``. Each step is
recorded in durun's journal; after a crash ``durun resume`` answers the
steps that finished from the journal (no LLM call, no repeated side
effect) and runs the rest.

* ``@durun.step("name")`` on a function, a method or an ``async def``
  makes each call a step whose args are the call's arguments (``self`` and
  ``cls`` left out; ``args=`` chooses them). ``durun.step(name, args, fn)``
  runs ``fn()`` as one step. ``retries=``, ``backoff=`` and ``timeout=``
  retry a failing step, every attempt journaled under the same key.
* ``durun.call(tool, **args)`` runs a tool declared in ``durun.toml``;
  ``durun.call_all([(tool, args), ...])`` runs several at once;
  ``await durun.acall(...)`` and ``await durun.acall_all(...)`` for asyncio.
* ``durun.wrap(client)`` journals every model call of an OpenAI or
  Anthropic client (sync or async, streaming too).
* ``durun.spawn(name, command, args)`` starts a child task and
  ``durun.join(task)`` waits for it (``join_all``; ``aspawn``, ``ajoin``,
  ``ajoin_all`` for asyncio); a child reads ``durun.args()``.
* ``durun.wait(name)``, ``durun.approval(data)`` and ``durun.sleep(...)``
  wait for a signal, a person, a time (``await_signal``,
  ``await_approval``, ``asleep`` for asyncio).
* ``durun.now()``, ``durun.random()``, ``durun.uuid()``: values fixed the
  first time, the same on every replay; ``durun.patched(name)`` lets
  changed code keep old tasks on their recorded path.
* ``durun.current()`` inside a step: its idempotency key, attempt and
  whether it is in doubt; ``durun.usage(...)`` records its tokens.
* ``durun.result(value)`` stores the task's final output.

Values: a step's args and return value are JSON, and a step returns
what the journal holds, on its first run as on a replay. Dataclasses and
pydantic models are stored as their fields (and come back as dicts),
``datetime``/``date`` as ISO 8601 strings, tuples as lists (a replay gives
a list; a warning says so once per step name). Anything else is refused
with a ``TypeError`` naming the step and the type: args before the step
runs, a return value right after. Nothing is ever pickled.

The module takes the process's stdout for the protocol and sends the
program's own prints (and its subprocesses' stdout) to stderr, so a print
can never corrupt a protocol line. Without durun (no ``DURUN_PROTOCOL`` in
the environment) steps simply run and ``call`` runs the tool through
``durun call`` from ``durun.toml``, journaled nowhere.
"""

from ._errors import (
    BadRequest as BadRequest,
    BudgetExceeded as BudgetExceeded,
    Cancelled as Cancelled,
    Divergence as Divergence,
    DurunError as DurunError,
    JournalError as JournalError,
    NotUnderDurun as NotUnderDurun,
    Timeout as Timeout,
    ToolFailed as ToolFailed,
    UnknownTool as UnknownTool,
)
from ._process import (
    active as active,
    _get_channel as _get_channel,
)
from ._steps import (
    StepContext as StepContext,
    current as current,
    step as step,
    usage as usage,
)
from ._tools import (
    acall as acall,
    acall_all as acall_all,
    call as call,
    call_all as call_all,
    result as result,
)
from ._children import (
    ajoin as ajoin,
    ajoin_all as ajoin_all,
    args as args,
    aspawn as aspawn,
    join as join,
    join_all as join_all,
    parent as parent,
    spawn as spawn,
)
from ._waiting import (
    approval as approval,
    asleep as asleep,
    await_approval as await_approval,
    await_signal as await_signal,
    sleep as sleep,
    wait as wait,
)
from ._stable import (
    now as now,
    patched as patched,
    random as random,
    uuid as uuid,
)

__all__ = [
    "step", "call", "call_all", "acall", "acall_all", "result", "current", "usage", "active",
    "wait", "approval", "sleep", "await_signal", "await_approval", "asleep",
    "now", "random", "uuid", "patched", "wrap",
    "spawn", "join", "join_all", "aspawn", "ajoin", "ajoin_all", "args", "parent",
    "DurunError", "BadRequest", "UnknownTool", "ToolFailed", "Timeout",
    "Divergence", "Cancelled", "JournalError", "BudgetExceeded", "NotUnderDurun", "StepContext",
]

from ._wrap import wrap  # noqa: E402  (wrap builds on the steps above)

# Under durun, take stdout for the protocol at once, before the program
# prints anything that could share a line with a request.
if active():
    _get_channel()
