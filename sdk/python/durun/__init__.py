"""durun for Python: journaled steps that survive a crash.

Run the script with ``durun run -- python3 agent.py``. Each step is
recorded in durun's journal; after a crash ``durun resume`` answers the
steps that finished from the journal (no LLM call, no repeated side
effect) and runs the rest.

* ``durun.step(name, args, fn, effect="read")`` runs ``fn()`` unless the
  journal holds the step, and records its return value (JSON) and token
  usage. As a decorator, ``@durun.step("name")`` uses the call's arguments
  as the step's args.
* ``durun.call(tool, **args)`` runs a tool declared in ``durun.toml``;
  ``durun.call_all([(tool, args), ...])`` runs several at once.
* ``durun.current()`` inside a step: its idempotency key, attempt and
  whether it is in doubt; ``durun.usage(...)`` records its tokens.
* ``durun.result(value)`` stores the task's final output.
* ``durun.wait(name, data=None, timeout=None)`` waits for a signal sent
  with ``durun signal TASK NAME`` (or ``durun approve``) and returns it;
  ``durun.approval(data)`` waits for ``durun approve``/``reject`` and
  returns True or False; ``durun.sleep(seconds_or_datetime)`` sleeps
  durably. A long wait parks the task: durun ends the script and exits 77,
  and ``durun resume`` carries on once the signal or the time has come.

The module takes the process's stdout for the protocol and sends the
program's own prints (and its subprocesses' stdout) to stderr, so a print
can never corrupt a protocol line. Without durun (no ``DURUN_PROTOCOL`` in
the environment) steps simply run.
"""

import datetime
import functools
import inspect
import itertools
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

#: An answer from durun: a JSON object.
Answer = Dict[str, Any]
T = TypeVar("T")

__all__ = [
    "step", "call", "call_all", "result", "current", "usage", "active",
    "wait", "approval", "sleep", "BudgetExceeded",
    "DurunError", "BadRequest", "UnknownTool", "ToolFailed", "Timeout",
    "Divergence", "Cancelled", "JournalError", "NotUnderDurun", "StepContext",
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
    """``call`` needs durun: the script was started without it."""

    code = "not_under_durun"


_ERRORS: Dict[str, "type[DurunError]"] = {cls.code: cls for cls in (BadRequest, UnknownTool, ToolFailed, Timeout, Divergence, Cancelled, JournalError,
                                                                  BudgetExceeded)}


def _error(answer: Answer) -> DurunError:
    error = answer.get("error") or {}
    cls = _ERRORS.get(str(error.get("code")), DurunError)
    return cls(error.get("message", "durun answered an error"), answer.get("step"), answer.get("output"))


def _line(message: Dict[str, Any]) -> str:
    """The request as one protocol line, or ValueError before anything is
    sent: NaN, Infinity and lone surrogates cannot be journaled as JSON."""
    try:
        text = json.dumps(message, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except ValueError as exc:
        what = message.get("name") or message.get("tool") or message.get("op")
        if isinstance(exc, UnicodeEncodeError):
            problem = "a string with a lone surrogate (bytes that are not text; encode them, e.g. base64)"
        else:
            problem = "NaN or Infinity (not JSON; send None, a number or a string)"
        raise ValueError(f"durun: the {message.get('op')} of {what!r} holds {problem}") from exc
    return text + "\n"


class _Channel:
    """Requests out on the protocol fd, answers in on stdin, matched by id;
    safe to use from many threads at once."""

    def __init__(self) -> None:
        # Keep the real stdout for the protocol, then point fd 1 (and so
        # print, and subprocesses) at stderr.
        sys.stdout.flush()
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._in = os.fdopen(os.dup(0), "r", encoding="utf-8")
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: Dict[int, threading.Event] = {}
        self._answers: Dict[int, Answer] = {}
        self._reader: Optional[threading.Thread] = None
        # Why the reader stopped, once it has: every later request gets it.
        self._gone: Optional[str] = None
        # durun answered `cancelled`: the run is stopping.
        self.stopping = False

    def request(self, message: Dict[str, Any]) -> Answer:
        return self.request_all([message])[0]

    def request_all(self, messages: List[Dict[str, Any]]) -> List[Answer]:
        """Sends every message before waiting for any answer, in order."""
        with self._lock:
            lines = []
            for message in messages:
                message["id"] = next(self._ids)
                lines.append(_line(message))
            pending = []
            for message, line in zip(messages, lines):
                ready = threading.Event()
                pending.append((message["id"], ready))
                if self._gone is not None:
                    self._answers[message["id"]] = self._failure(message["id"])
                    ready.set()
                    continue
                self._waiting[message["id"]] = ready
                self._out.write(line)
            self._out.flush()
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, name="durun-reader", daemon=True)
                self._reader.start()
        for _, ready in pending:
            ready.wait()
        with self._lock:
            return [self._answers.pop(request_id) for request_id, _ in pending]

    def _failure(self, request_id: int) -> Answer:
        return {"id": request_id, "ok": False, "error": {"code": "cancelled", "message": self._gone}}

    def _read(self) -> None:
        why = "durun closed the protocol"
        try:
            for line in self._in:
                answer = json.loads(line)
                if (answer.get("error") or {}).get("code") == "cancelled":
                    self.stopping = True
                with self._lock:
                    ready = self._waiting.pop(answer.get("id"), None)
                    self._answers[answer.get("id")] = answer
                if ready is not None:
                    ready.set()
        except Exception as exc:  # a line the SDK cannot read: no answer can be trusted
            why = f"the SDK could not read durun's answer: {exc}"
        # The reader is gone: wake everyone with an error, now and later.
        with self._lock:
            self._gone = why
            for request_id, ready in self._waiting.items():
                self._answers[request_id] = self._failure(request_id)
                ready.set()
            self._waiting.clear()


_channel = None
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
    with _channel_lock:
        if _channel is None:
            _channel = _Channel()
            sys.excepthook = _stop_hook(sys.excepthook)
            # Only Python's own handler is replaced, and only where signal
            # handlers can be set (the main thread).
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
                signal.signal(signal.SIGINT, _interrupted)
        return _channel


class StepContext:
    """What a running step knows about itself."""

    def __init__(self, step: int, idempotency_key: str, attempt: int, in_doubt: bool) -> None:
        self.step = step
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self.in_doubt = in_doubt
        self.usage: Optional[Dict[str, int]] = None


_local = threading.local()


def current() -> Optional[StepContext]:
    """The step running in this thread, or None."""
    return getattr(_local, "step", None)


def usage(input_tokens: int = 0, output_tokens: int = 0) -> None:
    """Records the token usage of the step running in this thread."""
    context = current()
    if context is not None:
        context.usage = {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens)}


def _usage_of(value: Any) -> Optional[Dict[str, Any]]:
    """Token usage found in an LLM-shaped answer (OpenAI or Anthropic)."""
    found = value.get("usage") if isinstance(value, dict) else None
    if isinstance(found, dict) and any(k in found for k in ("input_tokens", "output_tokens", "prompt_tokens", "completion_tokens")):
        return found
    return None


def _run_step(name: str, args: Any, fn: Callable[[], T], effect: str) -> T:
    if not active():
        # Without durun the step simply runs.
        return fn()
    channel = _get_channel()
    opened = channel.request({"op": "begin", "name": name, "args": args, "effect": effect})
    if not opened["ok"]:
        raise _error(opened)
    if opened.get("replayed"):
        # The recorded value of the step: what fn returned when it ran.
        return opened["output"]  # type: ignore[no-any-return]
    context = StepContext(opened["step"], opened.get("idempotency_key", ""), opened.get("attempt", 1),
                          opened.get("in_doubt", False))
    previous = current()
    _local.step = context
    try:
        value = fn()
    except (KeyboardInterrupt, SystemExit):
        # A stop is not the step's failure: the step stays open, and a
        # resume runs it again.
        raise
    except BaseException as exc:
        failed = channel.request({"op": "fail", "step": context.step, "error": f"{type(exc).__name__}: {exc}"})
        if not failed["ok"]:
            raise _error(failed) from exc
        raise
    finally:
        _local.step = previous
    try:
        _line({"op": "commit", "output": value})
    except (TypeError, ValueError) as exc:
        channel.request({"op": "fail", "step": context.step, "error": f"the step returned a value JSON cannot hold: {exc}"})
        raise TypeError(f"step {name!r} must return JSON (dict, list, str, number, bool or None): {exc}") from exc
    committed = channel.request({"op": "commit", "step": context.step, "output": value,
                                 "usage": context.usage or _usage_of(value)})
    if not committed["ok"]:
        raise _error(committed)
    return value


def step(name: str, args: Any = None, fn: Optional[Callable[[], Any]] = None, effect: str = "read") -> Any:
    """Runs ``fn()`` as journaled step ``name`` unless the journal holds it.

    ``durun.step(name, args, fn)`` returns fn's value, or the recorded one.
    ``@durun.step(name)`` on a function makes each call a step whose args
    are the call's arguments.
    """
    if effect not in ("read", "mutate"):
        raise ValueError("effect must be 'read' or 'mutate'")
    if fn is not None:
        return _run_step(name, {} if args is None else args, fn, effect)
    if callable(args):
        raise TypeError("use durun.step(name, args, fn) or @durun.step(name)")

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*call_args: Any, **call_kwargs: Any) -> Any:
            bound = signature.bind(*call_args, **call_kwargs)
            bound.apply_defaults()
            step_args = dict(args or {})
            step_args.update(bound.arguments)
            return _run_step(name, step_args, lambda: function(*call_args, **call_kwargs), effect)

        return wrapper

    return decorate


def call(tool: str, **args: Any) -> Any:
    """Runs ``tool`` from durun.toml with ``args`` and returns its output."""
    if not active():
        raise NotUnderDurun(f"durun.call({tool!r}) needs durun: run the script with `durun run -- python3 ...`")
    answer = _get_channel().request({"op": "call", "tool": tool, "args": args})
    if not answer["ok"]:
        raise _error(answer)
    return answer.get("output")


def call_all(calls: List[Tuple[str, Dict[str, Any]]]) -> List[Any]:
    """Runs several tools at once and returns their outputs, in order.

    ``calls`` is a list of ``(tool, args)`` pairs. durun runs the tools
    concurrently and writes the steps that finish together in one commit.
    The steps are numbered in list order, so a resumed run replays them the
    same way. Raises the first failure once every call has answered.
    """
    calls = [(tool, dict(args)) for tool, args in calls]
    if not active():
        raise NotUnderDurun("durun.call_all() needs durun: run the script with `durun run -- python3 ...`")
    answers = _get_channel().request_all([{"op": "call", "tool": tool, "args": args} for tool, args in calls])
    for answer in answers:
        if not answer["ok"]:
            raise _error(answer)
    return [answer.get("output") for answer in answers]


def result(value: Any) -> None:
    """Stores the task's final output (shown by ``durun inspect``)."""
    if not active():
        return
    answer = _get_channel().request({"op": "result", "output": value})
    if not answer["ok"]:
        raise _error(answer)


def _seconds(value: Any) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return float(value)


def wait(name: str, data: Any = None, timeout: Any = None) -> Dict[str, Any]:
    """Waits for the signal ``name`` and returns it:
    ``{"signal": name, "data": ..., "by": "user@host", "at": "RFC 3339"}``.

    ``data`` is shown to whoever answers (``durun inspect``) and is part of
    the step's identity. ``timeout`` (seconds, a ``timedelta`` or a string
    like ``"48h"``) counts from the first time the step waited; past it the
    step fails with :class:`Timeout`. A replay returns the recorded signal.
    """
    if not active():
        raise NotUnderDurun(f"durun.wait({name!r}) needs durun: run the script with `durun run -- python3 ...`")
    request: Dict[str, Any] = {"op": "wait", "name": name, "data": data}
    if timeout is not None:
        request["timeout"] = timeout if isinstance(timeout, str) else _seconds(timeout)
    answer = _get_channel().request(request)
    if not answer["ok"]:
        raise _error(answer)
    return answer["output"]  # type: ignore[no-any-return]


def approval(data: Any = None, name: str = "approval", timeout: Any = None) -> bool:
    """Waits for ``durun approve TASK`` (True) or ``durun reject TASK``
    (False); ``data`` is what the approver is asked about."""
    signal_data = wait(name, data, timeout).get("data")
    return isinstance(signal_data, dict) and signal_data.get("approved") is True


def sleep(until: Any) -> None:
    """Sleeps durably: ``until`` is seconds, a ``timedelta``, or an aware
    ``datetime``. The wake time is fixed the first time the step runs, so
    a resumed script sleeps only what is left; a long sleep parks the task."""
    if isinstance(until, datetime.datetime):
        if until.tzinfo is None:
            raise ValueError("durun.sleep() needs an aware datetime (with a tzinfo), e.g. datetime.now(timezone.utc)")
        stamp = until.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        request: Dict[str, Any] = {"op": "sleep", "until": stamp}
        seconds = (until - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    else:
        seconds = _seconds(until)
        request = {"op": "sleep", "seconds": seconds}
    if not active():
        time.sleep(max(0.0, seconds))
        return
    answer = _get_channel().request(request)
    if not answer["ok"]:
        raise _error(answer)


# Under durun, take stdout for the protocol at once, before the program
# prints anything that could share a line with a request.
if active():
    _get_channel()
