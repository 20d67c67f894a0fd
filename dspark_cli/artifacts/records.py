"""`Record`: a dataclass as JSON and back, the base of every stage's result (results.py) and of bench.json's
records (bench.py).

    summary.to_dict()                      # JSON-ready: nested records as dicts
    TrainSummary.from_dict(data)           # back: nested records typed again by their field types

Import-light: standard library only.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


@dataclass
class Record:
    """A result as JSON (`to_dict`) and back (`from_dict`: unknown keys are ignored, missing ones default)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _revive(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data})


def _revive(hint: Any, value: Any) -> Any:
    """`value` (from JSON) as the field type `hint` says: a Record from its dict, a list of them, else as is."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for option in typing.get_args(hint) if union else (hint,):  # `StreamSummary | None` -> StreamSummary
        if isinstance(option, type) and issubclass(option, Record) and isinstance(value, dict):
            return option.from_dict(value)
        if typing.get_origin(option) is list and isinstance(value, list):
            return [_revive(typing.get_args(option)[0], item) for item in value]
    return value
