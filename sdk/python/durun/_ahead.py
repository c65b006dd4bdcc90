"""Replays answered here: the recorded steps durun offers ahead (`ahead`),
each given back when the agent begins it under the same name and key, and
durun told which were used (`replayed`) before the agent's next request.
A replayed step then costs no round trip to durun."""

import collections
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ._values import _canonical


class _Ahead:
    """The steps offered and not used yet, and the last step used and not
    told yet. Used with the channel's lock held."""

    __slots__ = ("_task", "_steps", "_unsaid", "asked", "empty_at", "off", "_sha256")

    def __init__(self, task: str) -> None:
        self._task = task
        self._steps: Deque[Dict[str, Any]] = collections.deque()
        # The last step answered here and not yet told: (number, key).
        self._unsaid: Optional[Tuple[int, str]] = None
        # An `ahead` is on its way, unanswered.
        self.asked = False
        # The step number the agent was at when durun last offered
        # nothing: not asked again until it moves on.
        self.empty_at = -1
        # durun does not know `ahead` (an older durun): never asked again.
        self.off = False
        # hashlib.sha256, imported when steps are first offered: a first
        # run never needs it, and its import costs milliseconds of a start.
        self._sha256: Optional[Callable[[bytes], Any]] = None

    def left(self, last_step: int) -> bool:
        """Whether an offered step is left past ``last_step`` (the ones the
        numbering passed are dropped)."""
        steps = self._steps
        while steps and steps[0]["step"] <= last_step:
            steps.popleft()
        return bool(steps)

    def offered(self, answer: Dict[str, Any], last_step: int) -> None:
        """Takes durun's answer to `ahead`."""
        self.asked = False
        if not answer.get("ok") or not isinstance(answer.get("steps"), list):
            self.off = True
            return
        self._steps = collections.deque(answer["steps"])
        if not self._steps:
            self.empty_at = last_step
        elif self._sha256 is None:
            import hashlib

            self._sha256 = hashlib.sha256

    def take(self, name: str, args: Any) -> Optional[Tuple[Any, int]]:
        """The recorded value and number of the next offered step, if it is
        this one: the same name, and the key SPEC 3.1 derives from the
        args (the rule durun replays by). Else none is used again: durun
        answers the step, replay or divergence, as it always did."""
        if not self._steps or self._sha256 is None:
            return None
        recorded = self._steps[0]
        try:
            canonical = _canonical(args)
        except (TypeError, ValueError):  # durun words the refusal
            canonical = None
        key = recorded["idempotency_key"]
        step: int = recorded["step"]
        if canonical is None or recorded["name"] != name or key != self._sha256(
                f"{self._task}:{step}:{canonical}".encode("utf-8")).hexdigest():
            self._steps.clear()
            return None
        self._steps.popleft()
        self._unsaid = (step, key)
        return recorded.get("output"), step

    def notice_due(self) -> bool:
        """Whether steps were used that durun was not told of yet."""
        return self._unsaid is not None

    def notice(self) -> Optional[Dict[str, Any]]:
        """The `replayed` request for the steps used since the last one, if
        any: it must reach durun before any other request."""
        if self._unsaid is None:
            return None
        step, key = self._unsaid
        self._unsaid = None
        return {"op": "replayed", "through": step, "idempotency_key": key}
