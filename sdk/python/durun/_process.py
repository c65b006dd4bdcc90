"""The channel as the script has it: opened on first use, with the hooks
that make a stop one line and a script's end wait for its commits."""

import atexit
import os
import signal
import sys
import threading
from typing import Any, Callable, Optional

from ._types import Answer
from ._errors import Cancelled, DurunError, _error
from ._channel import _Channel


_channel: Optional[_Channel] = None
_channel_lock = threading.Lock()


def _open() -> Optional[_Channel]:
    """The channel, opened if need be, when the script runs under durun;
    else None."""
    if _channel is not None:
        return _channel
    return _get_channel() if os.environ.get("DURUN_PROTOCOL") == "1" else None


def active() -> bool:
    """Whether the script runs under durun (the channel, once open, says so
    without a look at the environment on every step)."""
    return _channel is not None or os.environ.get("DURUN_PROTOCOL") == "1"


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
        which = "a request" if exc.step is None else f"the commit of step {exc.step}"
        sys.stderr.write(f"durun: {which} was refused: {exc}\n")


def _checked(answer: Answer) -> Answer:
    if not answer["ok"]:
        raise _error(answer)
    return answer
