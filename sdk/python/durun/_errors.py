"""Typed errors: each error code of the protocol as an exception class."""

from typing import Any, Dict, Optional

from ._types import Answer


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
