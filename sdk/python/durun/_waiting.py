"""Waiting for people and time: signals, approvals, sleep."""

import datetime
import time
from typing import Any, Dict, Tuple, cast

from ._errors import NotUnderDurun
from ._values import _encode
from ._process import _checked, _get_channel, active


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
        import asyncio  # loaded: the event loop runs (see _channel)

        await asyncio.sleep(max(0.0, seconds))
        return
    _checked(await _get_channel().arequest(request))
