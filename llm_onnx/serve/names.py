"""The names a served model answers to.

A client's ``model`` field is matched, ignoring case, against the primary name (the first
``--model-name``, else the model folder's name), the other ``--model-name`` values, the folder's
name and the checkpoint's name the manifest records (``SmolLM2-135M-Instruct.Q4_1``,
``Qwen3-0.6B``). Answers and ``GET /v1/models`` carry the primary name, as OpenAI answers a
request for an alias with the model's own id; any other name is a 404 listing these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def split_names(given: str | Iterable[str] | None) -> list[str]:
    """``--model-name`` values (repeated, or one comma-separated list) as a list of names."""
    if given is None:
        return []
    items = [given] if isinstance(given, str) else list(given)
    return [name.strip() for item in items for name in item.split(",") if name.strip()]


@dataclass(frozen=True)
class ModelNames:
    """The primary name and the other names one served model answers to."""

    primary: str
    aliases: tuple[str, ...] = ()

    @classmethod
    def of(cls, given: str | Iterable[str] | None, folder: str | None = None,
           checkpoint: str | None = None) -> ModelNames:
        """``given`` (--model-name) first, then the folder's and the checkpoint's names, each
        once whatever its case."""
        names: list[str] = []
        for name in [*split_names(given), folder, checkpoint]:
            if name and name.casefold() not in {n.casefold() for n in names}:
                names.append(name)
        return cls(names[0] if names else "model", tuple(names[1:]))

    @property
    def all(self) -> tuple[str, ...]:
        return (self.primary, *self.aliases)

    def accepts(self, name: str) -> bool:
        return name.casefold() in {n.casefold() for n in self.all}

    def listed(self) -> str:
        """"`a`" or "`a` (also `b`, `c`)", for messages."""
        also = f" (also {', '.join(f'`{n}`' for n in self.aliases)})" if self.aliases else ""
        return f"`{self.primary}`{also}"

    def __str__(self) -> str:
        return self.primary
