"""Frozen dataclasses to and from JSON values: what manifest.json is written and read with.
``typed`` checks as it reads: every field of the declared type (dataclasses, tuples, dicts,
optionals, numbers, paths; a ModelConfig through its own from_dict), unknown fields refused,
errors naming the dotted path. Pure Python."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from llm_onnx.modeling.config import ModelConfig


def plain(value: Any) -> Any:
    """Dataclasses, tuples and paths as JSON values."""
    if isinstance(value, ModelConfig):
        return value.to_dict()
    if dataclasses.is_dataclass(value):  # fields marked omit_none are left out while None
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def typed(kind: Any, value: Any, where: str) -> Any:
    """``value`` (from JSON) as ``kind``: dataclasses, tuple[X, ...], dict[str, X], X | None."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return typed(option, value, where)
            except (TypeError, ValueError, KeyError) as e:
                errors.append(str(e))
        raise TypeError(f"{where}: {value!r} is none of {kind}")
    if kind is ModelConfig:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object")
        try:
            return ModelConfig.from_dict(value)
        except Exception as e:  # ConfigError and friends: a bad section
            raise ValueError(f"{where}: {e}") from None
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):  # a class, not an instance
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise KeyError(f"{where}.{unknown[0]} is not a known field")
        return kind(**{k: typed(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected a list")
        (item, _ellipsis) = typing.get_args(kind)
        return tuple(typed(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object")
        _, item = typing.get_args(kind)
        return {k: typed(item, v, f"{where}.{k}") for k, v in value.items()}
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind in (int, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"{where}: expected {kind.__name__}, got {value!r}")
        return value
    if kind is Path:
        return Path(value)
    raise TypeError(f"{where}: cannot read a {kind}")
