"""Types the SDK's modules share."""

from typing import Any, Callable, Dict, TypeVar

#: An answer from durun: a JSON object.
Answer = Dict[str, Any]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
