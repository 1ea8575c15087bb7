"""Reading the fields of a preprocessor_config.json / processor_config.json as transformers
reads them, refusing a value we do not support with an error that names the file and the field.

A missing field or ``null`` takes the processor's default. (transformers' image processor alone
keeps a ``null`` as None, which its flags read as false; its Processor fills Gemma 3's nulls,
``do_convert_rgb`` and ``do_pan_and_scan``, with true and false, the only nulls in the released
configs.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.runtime.media.pixels import RESAMPLE_NAMES


class Fields:
    """The fields of one processor config, read one at a time (``source`` names the file)."""

    def __init__(self, fields: Mapping[str, Any], source: str):
        self.fields = fields
        self.source = source

    def error(self, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: field {field!r} = {self.fields.get(field)!r}: "
                           f"{problem}")

    def get(self, field: str, default: Any) -> Any:
        value = self.fields.get(field)
        return default if value is None else value

    def flag(self, field: str, default: bool, *, must_be: bool | None = None) -> bool:
        value = self.get(field, default)
        if not isinstance(value, bool):
            raise self.error(field, "expected true or false.")
        if must_be is not None and value != must_be:
            raise self.error(field, f"only {str(must_be).lower()} is supported here.")
        return value

    def integer(self, field: str, default: int, *, minimum: int = 1,
                choices: tuple[int, ...] = ()) -> int:
        value = self.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(field, f"expected a whole number >= {minimum}.")
        if choices and value not in choices:
            raise self.error(field, f"supported values: {', '.join(map(str, choices))}.")
        return value

    def number(self, field: str, default: float) -> float:
        value = self.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self.error(field, "expected a number > 0.")
        return float(value)

    def channels(self, field: str, default: tuple[float, float, float],
                 ) -> tuple[float, float, float]:
        """Three per-channel numbers (one number stands for all three, as transformers reads it)."""
        value = self.get(field, default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value] * 3
        if (not isinstance(value, (list, tuple)) or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise self.error(field, "expected three numbers (R, G, B) or one number.")
        r, g, b = (float(v) for v in value)
        return r, g, b

    def resample(self, field: str, default: int) -> int:
        value = self.get(field, default)
        if isinstance(value, bool) or value not in RESAMPLE_NAMES:
            names = ", ".join(f"{k} ({v})" for k, v in RESAMPLE_NAMES.items())
            raise self.error(field, f"supported resampling filters: {names}.")
        return int(value)

    def size(self, field: str, default: Mapping[str, int], *, keys: tuple[str, str],
             square_int: bool = False) -> dict[str, int]:
        """A size dict with exactly ``keys``; with ``square_int`` a bare number n means n × n."""
        value = self.get(field, default)
        if square_int and isinstance(value, int) and not isinstance(value, bool):
            value = {keys[0]: value, keys[1]: value}
        if not isinstance(value, Mapping) or set(value) != set(keys) or not all(
                isinstance(value[k], int) and not isinstance(value[k], bool) and value[k] > 0
                for k in keys):
            raise self.error(field, f"expected {{{', '.join(repr(k) for k in keys)}}} with "
                                    "whole numbers > 0.")
        return {k: int(value[k]) for k in keys}
