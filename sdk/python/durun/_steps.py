"""Steps: `durun.step`, its context, retries, and the async form."""

import contextvars
import functools
import itertools
import threading
import time
import types
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, Optional, Tuple, cast, overload

from ._types import Answer, F, T
from ._errors import DurunError, Timeout
from ._values import _SCALARS, _begin_line, _commit_line, _encode
from ._channel import _SPIN, _SPIN_DURABLE, _Landing, _parsed
from ._process import _checked, _get_channel, _open, active

# asyncio and inspect are imported where needed (see _channel).
if TYPE_CHECKING:
    import inspect

#: inspect.CO_COROUTINE and CO_ITERABLE_COROUTINE: a code object's flags
#: for an `async def` and a `types.coroutine` generator.
_CO_COROUTINE = 0x80
_CO_ITERABLE_COROUTINE = 0x100


# Steps.

class StepContext(_Landing):
    """What a running step knows about itself: ``step``, ``idempotency_key``,
    ``attempt``, ``in_doubt``."""

    def __init__(self, step: int, idempotency_key: str, attempt: int, in_doubt: bool) -> None:
        self._step = step
        self._key = idempotency_key
        self._attempt = attempt
        self._in_doubt = in_doubt
        # The channel and id of the step's posted `begin`, until its
        # answer is read, and that answer once it came.
        self._begun: Optional[Tuple[Any, int]] = None
        self._begin_answer: Optional[Answer] = None
        self.usage: Optional[Dict[str, int]] = None

    @classmethod
    def _opened(cls, answer: Answer) -> "StepContext":
        """The step a `begin` answer opened."""
        return cls(answer["step"], answer.get("idempotency_key", ""), answer.get("attempt", 1),
                   answer.get("in_doubt", False))

    def _land(self, answer: Answer) -> None:
        self._begin_answer = answer

    def _answered(self) -> "StepContext":
        if self._begun is not None:
            channel = self._begun[0]
            channel._await_until(lambda: self._begin_answer is not None, _SPIN)
            answer = cast(Answer, self._begin_answer)
            if "_line" in answer:
                answer = _parsed(answer["_line"])
            answer = _checked(answer)
            self._begun = None
            self._step, self._key = answer["step"], answer.get("idempotency_key", "")
            self._attempt, self._in_doubt = answer.get("attempt", 1), answer.get("in_doubt", False)
        return self

    def _posted_step(self) -> Optional[int]:
        """The step's number, if known by now, without waiting for it."""
        if self._begun is None:
            return self._step
        return self._begin_answer.get("step") if self._begin_answer else None

    @property
    def step(self) -> int:
        return self._answered()._step

    @property
    def idempotency_key(self) -> str:
        return self._answered()._key

    @property
    def attempt(self) -> int:
        return self._answered()._attempt

    @property
    def in_doubt(self) -> bool:
        return self._answered()._in_doubt

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
    """Token usage found in an LLM-shaped answer (OpenAI or Anthropic), as
    `_encode` stored it (a plain dict, or no usage)."""
    if type(value) is not dict or "usage" not in value:
        return None
    found = value["usage"]
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


def _begin(name: str, encoded: Any, effect: str) -> Tuple[Dict[str, Any], bytes]:
    """A step's `begin` (its args as `_encode` gave them), as a message and
    its line: made only once the step is not replayed here."""
    return {"op": "begin", "name": name, "args": encoded, "effect": effect}, _begin_line(name, encoded, effect)


def _closing(name: str, context: StepContext, value: Any) -> Tuple[bytes, Any, bool]:
    """The commit of a step that returned ``value``: its line, the value
    as stored, and whether it reports token usage; TypeError or ValueError
    when it cannot be journaled."""
    stored = _encode(value, ("the value step %r returned", name))
    found = context.usage or _usage_of(stored)
    # A step whose `begin` was posted is named by it: its number may not
    # be known yet.
    if context._begun is None:
        line = _commit_line(name, "step", context._step, stored, found)
    else:
        line = _commit_line(name, "begin", context._begun[1], stored, found)
    return line, stored, bool(found)


# A step that reported token usage, or whose body ran this long, returns
# only once its commit is durable: a SIGKILL of durun right after cannot
# lose it, so its model call is never paid for twice. Shorter steps are
# posted (the agent goes on while durun writes them).
_DURABLE_AFTER = 0.005


def _waits(usage: bool, began: float) -> bool:
    return usage or time.monotonic() - began >= _DURABLE_AFTER


def _is_async(fn: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction``, at once for a plain function or
    lambda (a step's usual fn), whose code alone says it."""
    if type(fn) is types.FunctionType and not fn.__dict__:
        return bool(fn.__code__.co_flags & _CO_COROUTINE)
    import inspect

    return inspect.iscoroutinefunction(fn)


def _awaitable(value: Any) -> bool:
    """``inspect.isawaitable``: anything with ``__await__`` (a coroutine, a
    future), or a generator made a coroutine by ``types.coroutine``."""
    return hasattr(type(value), "__await__") or (
        type(value) is types.GeneratorType and bool(value.gi_code.co_flags & _CO_ITERABLE_COROUTINE))


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


def _run_alone(name: str, fn: Callable[[], T], policy: _Policy) -> T:
    """A step without durun: it simply runs (with its retries)."""
    for attempt in itertools.count(1):
        try:
            return _run_sync(fn, policy.timeout, name)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception:
            if attempt > policy.retries:
                raise
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def _run_step(name: str, args: Any, fn: Callable[[], T], effect: str, policy: _Policy = _NO_RETRIES) -> T:
    channel = _open()
    if channel is None:
        return _run_alone(name, fn, policy)
    encoded = _encode(args, ("the args of step %r", name))
    if effect == "read" and channel.past_journal():
        # New: it cannot be a replay or diverge, so it runs at once; its
        # `begin` is answered meanwhile, checked as posted commits are.
        context = StepContext(0, "", 1, False)
        context._begun = (channel, channel.post(_begin_line(name, encoded, effect), context))
        if context._begin_answer is not None:
            # Answered already: durun closed the protocol, and the step
            # cannot be journaled, so its body does not run (a model call
            # would be paid for and lost), as with a `begin` waited for.
            _checked(context._begin_answer)
    else:
        here = channel.replay_here(name, encoded)
        if here is not None:
            return cast(T, here[0])
        begin, line = _begin(name, encoded, effect)
        opened = _checked(channel.request_line(begin, line,
                                               _SPIN_DURABLE if effect == "mutate" else _SPIN,
                                               channel.ahead()))
        if opened.get("replayed"):
            # The recorded value of the step: what fn returned when it ran.
            return cast(T, opened["output"])
        context = StepContext._opened(opened)
    tries = 0
    while True:
        tries += 1
        token = _current.set(context)
        began = time.monotonic()
        try:
            value = fn() if policy.timeout is None else _run_sync(fn, policy.timeout, name)
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
        if type(value) is not dict and type(value) not in _SCALARS and _awaitable(value):
            # A lambda around a coroutine: the sync path cannot await it.
            getattr(value, "close", lambda: None)()
            message = (f"durun: step {name!r} returned an awaitable: pass an `async def` function "
                       "(`durun.step(name, args, async_fn)` then returns an awaitable), not a lambda around one")
            channel.request({"op": "fail", "step": context.step, "error": message})
            raise TypeError(message)
        try:
            body, stored, usage = _closing(name, context, value)
        except (TypeError, ValueError) as exc:
            channel.request({"op": "fail", "step": context.step, "error": str(exc)})
            raise TypeError(str(exc)) from exc
        if _waits(usage, began):
            _checked(channel.request_line({"op": "commit"}, body, _SPIN_DURABLE))
        else:
            # Posted: the agent goes on while durun writes it (see _Channel).
            channel.post(body, context._posted_step)
        # What the journal holds, as a replay will give it.
        return cast(T, stored)


async def _arun_step(name: str, args: Any, fn: Callable[[], Awaitable[T]], effect: str,
                     policy: _Policy = _NO_RETRIES) -> T:
    import asyncio

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
    encoded = _encode(args, ("the args of step %r", name))
    here = channel.replay_here(name, encoded)
    if here is not None:
        # Other tasks go first, as when durun's answer is awaited: the
        # steps they begin keep the numbers they had.
        await asyncio.sleep(0)
        return cast(T, here[0])
    begin, line = _begin(name, encoded, effect)
    opened = _checked(await channel.arequest_line(begin, line, channel.ahead()))
    if opened.get("replayed"):
        return cast(T, opened["output"])
    context = StepContext._opened(opened)
    tries = 0
    while True:
        tries += 1
        token = _current.set(context)
        began = time.monotonic()
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
            body, stored, usage = _closing(name, context, value)
        except (TypeError, ValueError) as exc:
            await channel.arequest({"op": "fail", "step": context.step, "error": str(exc)})
            raise TypeError(str(exc)) from exc
        if _waits(usage, began):
            _checked(await channel.arequest_line({"op": "commit"}, body))
        else:
            channel.post(body, context.step)
        return cast(T, stored)


def _call_args(function: Callable[..., Any], signature: "inspect.Signature", chosen: Any,
               call_args: Tuple[Any, ...], call_kwargs: Dict[str, Any]) -> Any:
    """A decorated call's step args: ``chosen(...)`` if it is callable,
    else the call's arguments (without ``self``/``cls``) over ``chosen``."""
    import inspect

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


def _is_thunk(value: Any) -> bool:
    """Whether ``value`` is a function that takes no arguments."""
    import inspect
    if not callable(value) or isinstance(value, type):
        return False
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(
        parameter.default is inspect.Parameter.empty
        and parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               inspect.Parameter.KEYWORD_ONLY)
        for parameter in parameters
    ) and not any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters)


@overload
def step(name: str, args: Callable[[], T], fn: None = None, effect: str = "read", *,
         retries: int = 0, backoff: float = 1.0, timeout: Optional[float] = None) -> T: ...


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
    (an ``async`` fn gives an awaitable); so does ``durun.step(name, fn)``
    with a function of no arguments (its args ``{}``). ``@durun.step(name)`` on a
    function, method or ``async def`` makes each call a step whose args are
    the call's arguments without ``self``/``cls``; ``args=`` a dict adds to
    them, ``args=`` a callable taking the call's arguments chooses them
    (leave out a client or a logger). ``retries``, ``backoff`` (seconds,
    doubling) and ``timeout`` (seconds per attempt) retry a failing step:
    every attempt is journaled under the same idempotency key.
    """
    if effect not in ("read", "mutate"):
        raise ValueError("effect must be 'read' or 'mutate'")
    if fn is None and _is_thunk(args):
        # `durun.step("name", lambda: ...)`: the callable is the step to
        # run, not a decorator's args (which a decorated call's arguments
        # are handed to); returning a decorator would run nothing.
        fn, args = args, None
    policy = _NO_RETRIES if retries == 0 and timeout is None else _Policy(retries, backoff, timeout)
    if fn is not None:
        if _is_async(fn):
            return _arun_step(name, {} if args is None else args, fn, effect, policy)
        return _run_step(name, {} if args is None else args, fn, effect, policy)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

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
