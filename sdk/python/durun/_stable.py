"""Values that must not change between runs, and code that does."""

import datetime
import random as _random

from ._process import _checked, _get_channel, active
from ._steps import step


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
    import uuid as _uuid  # here: its import costs milliseconds of a start

    return step("durun.uuid", {}, lambda: str(_uuid.uuid4()))


def patched(name: str) -> bool:
    """True where this code runs new, False while a task recorded before
    the patch ``name`` replays: ``if durun.patched("fix-prompt-2"): new
    else: old`` keeps old tasks on their recorded path and new ones on the
    new code. It is recorded as a step where it returns True."""
    if not active():
        return True
    return bool(_checked(_get_channel().request({"op": "patched", "name": name})).get("patched"))
