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

import asyncio
import contextvars
import dataclasses
import datetime
import functools
import inspect
import itertools
import json
import os
import atexit
import random as _random
import select
import signal
import subprocess
import sys
import threading
import time
import uuid as _uuid
from typing import (Any, Awaitable, Callable, Dict, List, Optional, Tuple,
                    TypeVar, cast, overload)

#: An answer from durun: a JSON object.
Answer = Dict[str, Any]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "step", "call", "call_all", "acall", "acall_all", "result", "current", "usage", "active",
    "wait", "approval", "sleep", "await_signal", "await_approval", "asleep",
    "now", "random", "uuid", "patched", "wrap",
    "DurunError", "BadRequest", "UnknownTool", "ToolFailed", "Timeout",
    "Divergence", "Cancelled", "JournalError", "BudgetExceeded", "NotUnderDurun", "StepContext",
]


class DurunError(Exception):
    """An error answer from durun; ``code`` is the protocol's error code."""

    code = "error"

    def __init__(self, message: str, step: Optional[int] = None, output: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.output = output


class BadRequest(DurunError):
    code = "bad_request"


class UnknownTool(DurunError):
    code = "unknown_tool"


class ToolFailed(DurunError):
    code = "tool_failed"


class Timeout(DurunError):
    """A tool, a ``wait`` or an attempt of a step with ``timeout=`` ran out
    of time."""

    code = "timeout"


class Divergence(DurunError):
    """The script asked for another step than the journal holds: its path
    changed since the crash. durun stops the run."""

    code = "divergence"


class Cancelled(DurunError):
    code = "cancelled"


class JournalError(DurunError):
    code = "journal"


class BudgetExceeded(DurunError):
    """The task's token budget is spent (``--max-tokens``): durun stops the
    run; ``durun resume TASK --max-tokens N`` raises it."""

    code = "budget_exceeded"


class NotUnderDurun(DurunError):
    """The call needs durun: the script was started without it."""

    code = "not_under_durun"


_ERRORS: Dict[str, "type[DurunError]"] = {
    cls.code: cls
    for cls in (BadRequest, UnknownTool, ToolFailed, Timeout, Divergence, Cancelled, JournalError, BudgetExceeded)
}


def _error(answer: Answer) -> DurunError:
    error = answer.get("error") or {}
    cls = _ERRORS.get(str(error.get("code")), DurunError)
    return cls(error.get("message", "durun answered an error"), answer.get("step"), answer.get("output"))


# --------------------------------------------------------------------------
# Values: what a step may take and return.

_warned_tuples: "set[str]" = set()


def _encode(value: Any, where: str) -> Any:
    """``value`` as JSON data, by the module's documented rules; TypeError
    naming ``where`` and the type for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"durun: {where} holds a dict key of type {type(key).__name__}; JSON keys are strings")
            out[key] = _encode(item, where)
        return out
    if isinstance(value, list):
        return [_encode(item, where) for item in value]
    if isinstance(value, tuple):
        if where not in _warned_tuples:
            _warned_tuples.add(where)
            sys.stderr.write(f"durun: {where} holds a tuple; it is stored as a list, and a replay gives a list\n")
        return [_encode(item, where) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode(dataclasses.asdict(value), where)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic v2, and the OpenAI and Anthropic clients' types
        return _encode(dump(mode="json"), where)
    legacy = getattr(value, "dict", None)
    if callable(legacy) and hasattr(value, "__fields__"):  # pydantic v1
        return _encode(legacy(), where)
    raise TypeError(
        f"durun: {where} holds a {type(value).__module__}.{type(value).__qualname__}, which durun cannot journal: "
        "use JSON values (dict, list, str, number, bool, None), a dataclass, a pydantic model or a datetime, "
        "or convert it yourself (durun never pickles)")


def _line(message: Dict[str, Any]) -> bytes:
    """The request as one protocol line (UTF-8), or ValueError before
    anything is sent: NaN, Infinity and lone surrogates cannot be journaled
    as JSON."""
    try:
        line = json.dumps(message, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError as exc:
        what = message.get("name") or message.get("tool") or message.get("op")
        if isinstance(exc, UnicodeEncodeError):
            problem = "a string with a lone surrogate (bytes that are not text; encode them, e.g. base64)"
        else:
            problem = "NaN or Infinity (not JSON; send None, a number or a string)"
        raise ValueError(f"durun: the {message.get('op')} of {what!r} holds {problem}") from exc
    return line + b"\n"


# --------------------------------------------------------------------------
# The channel: requests out on the real stdout, answers in on stdin.

#: How long a reader looks for an answer before it sleeps (seconds): an
#: answer durun gives from memory (a `read` step's begin, a replayed step)
#: comes within a round trip; one that waits for a commit (a `mutate`
#: step's begin), within an fsync. Sleeping and being woken costs tens of
#: microseconds on many machines (more on a VM, whose idle core halts).
_SPIN = 50e-6
_SPIN_DURABLE = 1e-3


class _Waiter:
    """Where one answer goes: a thread that waits for it (on the channel's
    condition, or reading stdin itself), or an asyncio future in its loop."""

    __slots__ = ("future", "loop", "answer", "spin")

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None, spin: float = 0.0) -> None:
        self.loop = loop
        # How long its reader looks for the answer before it sleeps.
        self.spin = spin
        self.future: Optional["asyncio.Future[Answer]"] = loop.create_future() if loop else None
        self.answer: Optional[Answer] = None

    def deliver(self, answer: Answer) -> None:
        """With the channel's lock held (whose condition wakes threads)."""
        self.answer = answer
        if self.loop is not None and self.future is not None:
            future = self.future

            def resolve() -> None:
                if not future.done():
                    future.set_result(answer)

            self.loop.call_soon_threadsafe(resolve)


class _Channel:
    """Requests out on the protocol fd, answers in on stdin, matched by id;
    safe to use from many threads and event loops at once.

    A thread that waits for an answer reads stdin itself (one thread at a
    time, handing other threads' answers to them), so a plain loop of
    steps costs no hand-off between threads. Once an event loop waits for
    an answer, a reader thread takes over the reading for good: a future
    has no thread of its own to read with.

    A step's ``commit`` is posted, not awaited: the step's value is
    returned at once and its answer checked when it comes. A failed commit
    is raised by the next request, by ``result`` or at exit (``settle``);
    durun makes every commit durable before the intent of any ``mutate``
    step opened after it, so nothing a later side effect relies on can be
    lost."""

    def __init__(self) -> None:
        # Keep the real stdout for the protocol, then point fd 1 (and so
        # print, and subprocesses) at stderr.
        sys.stdout.flush()
        self._out = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._fd = os.dup(0)
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # Signalled when an answer is handed over or the reading is free.
        self._turn = threading.Condition(self._lock)
        # Threads asleep on `_turn`: with none (a plain loop of steps), an
        # answer wakes no one and costs no notify.
        self._sleepers = 0
        self._waiting: Dict[int, _Waiter] = {}
        # Posted requests whose answers have not come yet: their steps.
        self._posted: Dict[int, Any] = {}
        # The first posted request durun refused: raised from then on.
        self._refused: Optional[Answer] = None
        self._reader: Optional[threading.Thread] = None
        # A waiting thread is reading stdin now.
        self._leading = False
        # Why the reading stopped, once it has: every later request gets it.
        self._gone: Optional[str] = None
        # durun answered `cancelled`: the run is stopping.
        self.stopping = False

    def send(self, messages: List[Dict[str, Any]], loop: Optional[asyncio.AbstractEventLoop] = None,
             posted: bool = False, bodies: Optional[List[bytes]] = None, spin: Optional[float] = None) -> List[_Waiter]:
        """Writes every message, in order, before any answer is awaited:
        the order of the lines is the order of the steps. `bodies`, if
        given, are the messages already made lines (by `_line`)."""
        if bodies is None:
            bodies = [_line(message) for message in messages]
        with self._lock:
            self._raise_refused()
            lines = []
            for message, body in zip(messages, bodies):
                message["id"] = next(self._ids)
                lines.append(b'{"id":%d,%s' % (message["id"], body[1:]))
            waiters = []
            out = []
            for message, line in zip(messages, lines):
                waiter = _Waiter(loop, _SPIN if spin is None else spin)
                waiters.append(waiter)
                if self._gone is not None:
                    waiter.deliver(self._failure(message["id"]))
                    continue
                self._waiting[message["id"]] = waiter
                if posted:
                    self._posted[message["id"]] = message.get("step")
                out.append(line)
            data = b"".join(out)
            while data:
                data = data[os.write(self._out, data):]
            if loop is not None and not self._leading:
                self._start_reader()
        return waiters

    def post(self, message: Dict[str, Any], body: bytes) -> None:
        """Sends a request whose answer no one waits for (see the class)."""
        self.send([message], posted=True, bodies=[body])

    def settle(self) -> None:
        """Waits for the answer of every posted request; raises the first
        refusal."""
        while True:
            with self._lock:
                pending = next((self._waiting.get(posted) for posted in self._posted), None)
            if pending is None:
                break
            self._await(pending)
        with self._lock:
            self._raise_refused()

    def _start_reader(self) -> None:
        """With the lock held: a thread to read for the futures."""
        if self._reader is None and self._gone is None:
            self._reader = threading.Thread(target=self._read, name="durun-reader", daemon=True)
            self._reader.start()

    def request(self, message: Dict[str, Any], spin: Optional[float] = None) -> Answer:
        return self.request_all([message], spin)[0]

    def request_all(self, messages: List[Dict[str, Any]], spin: Optional[float] = None) -> List[Answer]:
        waiters = self.send(messages, spin=spin)
        for waiter in waiters:
            self._await(waiter)
        self._raise_refused()
        return [cast(Answer, waiter.answer) for waiter in waiters]

    def _raise_refused(self) -> None:
        """A refusal read while waiting is raised by the request that waited:
        durun's answer to it (most often `cancelled`, the run stopping) is
        a consequence."""
        if self._refused is not None:
            raise _error(self._refused)

    def _await(self, waiter: _Waiter) -> None:
        """Waits for `waiter`'s answer, reading stdin itself when no one
        else does."""
        while waiter.answer is None:
            with self._lock:
                while waiter.answer is None and (self._leading or self._reader is not None):
                    self._sleepers += 1
                    self._turn.wait()
                    self._sleepers -= 1
                if waiter.answer is not None:
                    return
                self._leading = True
            try:
                while waiter.answer is None and self._read_one(waiter.spin):
                    pass
            finally:
                with self._lock:
                    self._leading = False
                    # Futures still waiting need a reader of their own now.
                    if any(other.loop is not None for other in self._waiting.values()):
                        self._start_reader()
                    self._wake()

    async def arequest(self, message: Dict[str, Any]) -> Answer:
        return (await self.arequest_all([message]))[0]

    async def arequest_all(self, messages: List[Dict[str, Any]]) -> List[Answer]:
        waiters = self.send(messages, asyncio.get_running_loop())
        answers = [await cast("asyncio.Future[Answer]", waiter.future) for waiter in waiters]
        self._raise_refused()
        return answers

    def _failure(self, request_id: int) -> Answer:
        return {"id": request_id, "ok": False, "error": {"code": "cancelled", "message": self._gone}}

    def _readline(self, spin: float) -> bytes:
        """The next line from durun (empty at the end). Right after a
        request its answer usually comes within microseconds: the reader
        looks for it briefly before it sleeps, since a wake-up from sleep
        costs more than the answer itself."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end + 1])
                del self._buffer[:end + 1]
                return line
            deadline = time.perf_counter() + spin
            while not self._poll.poll(0) and time.perf_counter() < deadline:
                pass
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                return b""
            self._buffer += chunk

    def _read_one(self, spin: float = _SPIN) -> bool:
        """Reads one answer and hands it over; False once stdin is done
        (every waiter then gets an error, now and later)."""
        try:
            line = self._readline(spin)
            if not line:
                return self._close("durun closed the protocol")
            answer = json.loads(line.decode("utf-8"))
        except Exception as exc:  # a line the SDK cannot read: no answer can be trusted
            return self._close(f"the SDK could not read durun's answer: {exc}")
        if (answer.get("error") or {}).get("code") == "cancelled":
            self.stopping = True
        with self._lock:
            waiter = self._waiting.pop(answer.get("id"), None)
            if waiter is not None:
                if answer["id"] in self._posted:
                    # No one waits for it (a pipelined commit): checked here.
                    step = self._posted.pop(answer["id"])
                    if not answer.get("ok") and self._refused is None:
                        self._refused = {**answer, "step": answer.get("step", step)}
                waiter.deliver(answer)
            self._wake()
        return True

    def _wake(self) -> None:
        """With the lock held: wakes the threads waiting on `_turn`."""
        if self._sleepers:
            self._turn.notify_all()

    def _close(self, why: str) -> bool:
        with self._lock:
            self._gone = why
            waiting = list(self._waiting.items())
            self._waiting.clear()
            self._posted.clear()
            for request_id, waiter in waiting:
                waiter.deliver(self._failure(request_id))
            self._turn.notify_all()
        return False

    def _read(self) -> None:
        while self._read_one():
            pass



_channel: Optional[_Channel] = None
_channel_lock = threading.Lock()


def active() -> bool:
    """Whether the script runs under durun."""
    return os.environ.get("DURUN_PROTOCOL") == "1"


def _stop_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """An excepthook that shows a stop as one line. Python still exits as
    SIGINT says (130) after a KeyboardInterrupt."""

    def show(kind: Any, value: BaseException, traceback: Any) -> None:
        if issubclass(kind, KeyboardInterrupt) or (issubclass(kind, Cancelled) and _stopping()):
            try:
                # A second SIGINT (durun passes one on) must not break this
                # line or the shutdown; Python still ends by SIGINT (130).
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            except ValueError:
                pass
            task = os.environ.get("DURUN_TASK_ID", "")
            sys.stderr.write(f"durun: the agent was stopped; `durun resume {task}` continues the task\n")
            return
        hook(kind, value, traceback)

    return show


def _stopping() -> bool:
    return _channel is not None and _channel.stopping


def _interrupted(signum: int, frame: Any) -> None:
    """SIGINT under durun: the first one stops the script; later ones, which
    a Ctrl-C delivers (the terminal and durun both send one), are ignored
    so that they cannot break the stop halfway with a second traceback.
    durun kills an agent that does not exit in time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _get_channel() -> _Channel:
    global _channel
    if _channel is not None:
        return _channel
    with _channel_lock:
        if _channel is None:
            _channel = _Channel()
            atexit.register(_settle_at_exit)
            sys.excepthook = _stop_hook(sys.excepthook)
            # Only Python's own handler is replaced, and only where signal
            # handlers can be set (the main thread).
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
                signal.signal(signal.SIGINT, _interrupted)
        return _channel


def _settle_at_exit() -> None:
    """A script that ends waits for its posted commits; a refused one is
    reported, never lost."""
    if _channel is None:
        return
    try:
        _channel.settle()
    except DurunError as exc:
        sys.stderr.write(f"durun: the commit of step {exc.step} was refused: {exc}\n")


def _checked(answer: Answer) -> Answer:
    if not answer["ok"]:
        raise _error(answer)
    return answer


# --------------------------------------------------------------------------
# Steps.

class StepContext:
    """What a running step knows about itself."""

    def __init__(self, step: int, idempotency_key: str, attempt: int, in_doubt: bool) -> None:
        self.step = step
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.in_doubt = in_doubt
        self.usage: Optional[Dict[str, int]] = None

    @classmethod
    def _opened(cls, answer: Answer) -> "StepContext":
        """The step a `begin` answer opened."""
        return cls(answer["step"], answer.get("idempotency_key", ""), answer.get("attempt", 1),
                   answer.get("in_doubt", False))

    def _retried(self, answer: Answer) -> "StepContext":
        """The same step's next attempt, from the `retry` answer (same key)."""
        return StepContext(self.step, self.idempotency_key, answer.get("attempt", self.attempt + 1), False)


# A context variable: each thread and each asyncio task sees its own step.
_current: "contextvars.ContextVar[Optional[StepContext]]" = contextvars.ContextVar("durun_step", default=None)


def current() -> Optional[StepContext]:
    """The step running in this thread or asyncio task, or None."""
    return _current.get()


def usage(input_tokens: int = 0, output_tokens: int = 0) -> None:
    """Records the token usage of the step running here."""
    context = current()
    if context is not None:
        context.usage = {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens)}


def _usage_of(value: Any) -> Optional[Dict[str, Any]]:
    """Token usage found in an LLM-shaped answer (OpenAI or Anthropic)."""
    found = value.get("usage") if isinstance(value, dict) else None
    if isinstance(found, dict) and any(k in found for k in ("input_tokens", "output_tokens", "prompt_tokens", "completion_tokens")):
        return found
    return None


class _Policy:
    """How a step retries: ``retries`` more attempts after a failure,
    ``backoff`` seconds before the first (doubling), ``timeout`` seconds per
    attempt."""

    def __init__(self, retries: int = 0, backoff: float = 1.0, timeout: Optional[float] = None) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout

    def delay(self, attempt: int) -> float:
        return float(self.backoff * (2 ** max(0, attempt - 1)))


_NO_RETRIES = _Policy()


def _failure_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _begin(name: str, args: Any, effect: str) -> Dict[str, Any]:
    return {"op": "begin", "name": name, "args": _encode(args, f"the args of step {name!r}"), "effect": effect}


def _closing(name: str, context: StepContext, value: Any) -> Tuple[Dict[str, Any], bytes, Any]:
    """The commit of a step that returned ``value``, as a message and its
    line, and the value as stored; TypeError or ValueError when it cannot
    be journaled."""
    stored = _encode(value, f"the value step {name!r} returned")
    commit = {"op": "commit", "step": context.step, "output": stored, "usage": context.usage or _usage_of(stored)}
    return commit, _line(commit), stored


def _run_sync(fn: Callable[[], T], timeout: Optional[float], name: str) -> T:
    """Runs fn, in a helper thread when it has a time limit (a thread cannot
    be killed: past the limit it is left to finish, unheard)."""
    if timeout is None:
        return fn()
    outcome: Dict[str, Any] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            outcome["value"] = context.run(fn)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=target, name=f"durun-step-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise Timeout(f"step {name!r} ran past its timeout of {timeout}s")
    if "error" in outcome:
        raise outcome["error"]
    return cast(T, outcome["value"])


def _run_step(name: str, args: Any, fn: Callable[[], T], effect: str, policy: _Policy = _NO_RETRIES) -> T:
    if not active():
        # Without durun the step simply runs (with its retries).
        for attempt in itertools.count(1):
            try:
                return _run_sync(fn, policy.timeout, name)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception:
                if attempt > policy.retries:
                    raise
                time.sleep(policy.delay(attempt))
    channel = _get_channel()
    opened = _checked(channel.request(_begin(name, args, effect), _SPIN_DURABLE if effect == "mutate" else _SPIN))
    if opened.get("replayed"):
        # The recorded value of the step: what fn returned when it ran.
        return cast(T, opened["output"])
    context = StepContext._opened(opened)
    tries = 0
    while True:
        tries += 1
        token = _current.set(context)
        try:
            value = _run_sync(fn, policy.timeout, name)
        except (KeyboardInterrupt, SystemExit):
            # A stop is not the step's failure: the step stays open, and a
            # resume runs it again.
            raise
        except BaseException as exc:
            _checked(channel.request({"op": "fail", "step": context.step, "error": _failure_text(exc)}))
            if tries > policy.retries or isinstance(exc, DurunError) and not isinstance(exc, Timeout):
                raise
            time.sleep(policy.delay(tries))
            # The next attempt, journaled, with the same key.
            reopened = _checked(channel.request({"op": "retry", "step": context.step}))
            context = context._retried(reopened)
            continue
        finally:
            _current.reset(token)
        if inspect.isawaitable(value):
            # A lambda around a coroutine: the sync path cannot await it.
            getattr(value, "close", lambda: None)()
            message = (f"durun: step {name!r} returned an awaitable: pass an `async def` function "
                       "(`durun.step(name, args, async_fn)` then returns an awaitable), not a lambda around one")
            channel.request({"op": "fail", "step": context.step, "error": message})
            raise TypeError(message)
        try:
            commit, body, stored = _closing(name, context, value)
        except (TypeError, ValueError) as exc:
            channel.request({"op": "fail", "step": context.step, "error": str(exc)})
            raise TypeError(str(exc)) from exc
        # Posted: the agent goes on while durun writes it (see _Channel).
        channel.post(commit, body)
        # What the journal holds, as a replay will give it.
        return cast(T, stored)


async def _arun_step(name: str, args: Any, fn: Callable[[], Awaitable[T]], effect: str,
                     policy: _Policy = _NO_RETRIES) -> T:
    async def attempt_once() -> T:
        if policy.timeout is None:
            return await fn()
        try:
            return await asyncio.wait_for(fn(), policy.timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"step {name!r} ran past its timeout of {policy.timeout}s") from None

    if not active():
        for attempt in itertools.count(1):
            try:
                return await attempt_once()
            except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
                raise
            except Exception:
                if attempt > policy.retries:
                    raise
                await asyncio.sleep(policy.delay(attempt))
    channel = _get_channel()
    opened = _checked(await channel.arequest(_begin(name, args, effect)))
    if opened.get("replayed"):
        return cast(T, opened["output"])
    context = StepContext._opened(opened)
    tries = 0
    while True:
        tries += 1
        token = _current.set(context)
        try:
            value = await attempt_once()
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise
        except BaseException as exc:
            _checked(await channel.arequest({"op": "fail", "step": context.step, "error": _failure_text(exc)}))
            if tries > policy.retries or isinstance(exc, DurunError) and not isinstance(exc, Timeout):
                raise
            await asyncio.sleep(policy.delay(tries))
            reopened = _checked(await channel.arequest({"op": "retry", "step": context.step}))
            context = context._retried(reopened)
            continue
        finally:
            _current.reset(token)
        try:
            commit, body, stored = _closing(name, context, value)
        except (TypeError, ValueError) as exc:
            await channel.arequest({"op": "fail", "step": context.step, "error": str(exc)})
            raise TypeError(str(exc)) from exc
        channel.post(commit, body)
        return cast(T, stored)


def _call_args(function: Callable[..., Any], signature: inspect.Signature, chosen: Any,
               call_args: Tuple[Any, ...], call_kwargs: Dict[str, Any]) -> Any:
    """A decorated call's step args: ``chosen(...)`` if it is callable,
    else the call's arguments (without ``self``/``cls``) over ``chosen``."""
    bound = signature.bind(*call_args, **call_kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    params = list(signature.parameters)
    own = bool(params) and params[0] in ("self", "cls") and "." in function.__qualname__
    if own:
        arguments.pop(params[0], None)
        call_args = call_args[1:]
    if callable(chosen):
        return chosen(*call_args, **call_kwargs)
    step_args = dict(chosen or {})
    for key, value in arguments.items():
        kind = signature.parameters[key].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            step_args.update(value)
        else:
            step_args[key] = value
    return step_args


@overload
def step(name: str, args: Any = None, fn: None = None, effect: str = "read", *,
         retries: int = 0, backoff: float = 1.0, timeout: Optional[float] = None) -> Callable[[F], F]: ...


@overload
def step(name: str, args: Any, fn: Callable[[], T], effect: str = "read", *,
         retries: int = 0, backoff: float = 1.0, timeout: Optional[float] = None) -> T: ...


def step(name: str, args: Any = None, fn: Optional[Callable[[], Any]] = None, effect: str = "read", *,
         retries: int = 0, backoff: float = 1.0, timeout: Optional[float] = None) -> Any:
    """Runs ``fn()`` as journaled step ``name`` unless the journal holds it.

    ``durun.step(name, args, fn)`` returns fn's value, or the recorded one
    (an ``async`` fn gives an awaitable). ``@durun.step(name)`` on a
    function, method or ``async def`` makes each call a step whose args are
    the call's arguments without ``self``/``cls``; ``args=`` a dict adds to
    them, ``args=`` a callable taking the call's arguments chooses them
    (leave out a client or a logger). ``retries``, ``backoff`` (seconds,
    doubling) and ``timeout`` (seconds per attempt) retry a failing step:
    every attempt is journaled under the same idempotency key.
    """
    if effect not in ("read", "mutate"):
        raise ValueError("effect must be 'read' or 'mutate'")
    policy = _Policy(retries, backoff, timeout)
    if fn is not None:
        if inspect.iscoroutinefunction(fn):
            return _arun_step(name, {} if args is None else args, fn, effect, policy)
        return _run_step(name, {} if args is None else args, fn, effect, policy)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(function)
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def awrapper(*call_args: Any, **call_kwargs: Any) -> Any:
                step_args = _call_args(function, signature, args, call_args, call_kwargs)
                return await _arun_step(name, step_args, lambda: function(*call_args, **call_kwargs), effect, policy)

            return awrapper

        @functools.wraps(function)
        def wrapper(*call_args: Any, **call_kwargs: Any) -> Any:
            step_args = _call_args(function, signature, args, call_args, call_kwargs)
            return _run_step(name, step_args, lambda: function(*call_args, **call_kwargs), effect, policy)

        return wrapper

    return decorate


# --------------------------------------------------------------------------
# Tools.

def _standalone(tool: str, args: Dict[str, Any]) -> Any:
    """A tool outside durun: ``durun call`` runs it from durun.toml, once,
    journaled nowhere."""
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


# --------------------------------------------------------------------------
# Waiting for people and time.

def _seconds(value: Any) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return float(value)


def _wait_request(name: str, data: Any, timeout: Any) -> Dict[str, Any]:
    request: Dict[str, Any] = {"op": "wait", "name": name, "data": _encode(data, f"the data of wait {name!r}")}
    if timeout is not None:
        request["timeout"] = timeout if isinstance(timeout, str) else _seconds(timeout)
    return request


def wait(name: str, data: Any = None, timeout: Any = None) -> Dict[str, Any]:
    """Waits for the signal ``name`` and returns it:
    ``{"signal": name, "data": ..., "by": "user@host", "at": "RFC 3339"}``.

    ``data`` is shown to whoever answers (``durun inspect``) and is part of
    the step's identity. ``timeout`` (seconds, a ``timedelta`` or a string
    like ``"48h"``) counts from the first time the step waited; past it the
    step fails with :class:`Timeout`. A replay returns the recorded signal.
    A wait longer than durun's ``--park-after`` parks the task (exit 77).
    """
    if not active():
        raise NotUnderDurun(f"durun.wait({name!r}) needs durun: run the script with `durun run -- python3 ...`")
    return cast(Dict[str, Any], _checked(_get_channel().request(_wait_request(name, data, timeout)))["output"])


async def await_signal(name: str, data: Any = None, timeout: Any = None) -> Dict[str, Any]:
    """``wait`` for asyncio."""
    if not active():
        raise NotUnderDurun(f"durun.await_signal({name!r}) needs durun: run the script with `durun run -- python3 ...`")
    answer = _checked(await _get_channel().arequest(_wait_request(name, data, timeout)))
    return cast(Dict[str, Any], answer["output"])


def _approved(signal_data: Any) -> bool:
    return isinstance(signal_data, dict) and signal_data.get("approved") is True


def approval(data: Any = None, name: str = "approval", timeout: Any = None) -> bool:
    """Waits for ``durun approve TASK`` (True) or ``durun reject TASK``
    (False); ``data`` is what the approver is asked about."""
    return _approved(wait(name, data, timeout).get("data"))


async def await_approval(data: Any = None, name: str = "approval", timeout: Any = None) -> bool:
    """``approval`` for asyncio."""
    return _approved((await await_signal(name, data, timeout)).get("data"))


def _sleep_request(until: Any) -> Tuple[Dict[str, Any], float]:
    if isinstance(until, datetime.datetime):
        if until.tzinfo is None:
            raise ValueError("durun.sleep() needs an aware datetime (with a tzinfo), e.g. datetime.now(timezone.utc)")
        stamp = until.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        seconds = (until - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        return {"op": "sleep", "until": stamp}, seconds
    seconds = _seconds(until)
    return {"op": "sleep", "seconds": seconds}, seconds


def sleep(until: Any) -> None:
    """Sleeps durably: ``until`` is seconds, a ``timedelta``, or an aware
    ``datetime``. The wake time is fixed the first time the step runs, so
    a resumed script sleeps only what is left; a long sleep parks the task."""
    request, seconds = _sleep_request(until)
    if not active():
        time.sleep(max(0.0, seconds))
        return
    _checked(_get_channel().request(request))


async def asleep(until: Any) -> None:
    """``sleep`` for asyncio."""
    request, seconds = _sleep_request(until)
    if not active():
        await asyncio.sleep(max(0.0, seconds))
        return
    _checked(await _get_channel().arequest(request))


# --------------------------------------------------------------------------
# Values that must not change between runs, and code that does.

def now() -> datetime.datetime:
    """The time, journaled: the first run's, on every replay (an aware UTC
    datetime). Put this, not ``datetime.now()``, in what a step depends on."""
    stamp = step("durun.now", {}, lambda: datetime.datetime.now(datetime.timezone.utc).isoformat())
    return datetime.datetime.fromisoformat(stamp)


def random() -> float:
    """A random float in [0, 1), journaled: the same on every replay."""
    return step("durun.random", {}, _random.random)


def uuid() -> str:
    """A random UUID (as text), journaled: the same on every replay."""
    return step("durun.uuid", {}, lambda: str(_uuid.uuid4()))


def patched(name: str) -> bool:
    """True where this code runs new, False while a task recorded before
    the patch ``name`` replays: ``if durun.patched("fix-prompt-2"): new
    else: old`` keeps old tasks on their recorded path and new ones on the
    new code. It is recorded as a step where it returns True."""
    if not active():
        return True
    return bool(_checked(_get_channel().request({"op": "patched", "name": name})).get("patched"))


from ._wrap import wrap  # noqa: E402  (wrap builds on the steps above)

# Under durun, take stdout for the protocol at once, before the program
# prints anything that could share a line with a request.
if active():
    _get_channel()
