"""Generation options: how a sequence picks its tokens and when it stops, checked in one place
(every bad value is a one-line ``GenerationError`` naming the option and what is allowed)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, ItemsView, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.structured.constraint import Constraint

__all__ = ["GenerationOptions"]


@dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """How to pick tokens and when to stop. Call ``validated()`` before use (the Sampler does).

    Args:
        max_new_tokens: upper bound on generated tokens; 0 generates none (a prompt run only to
            score it: ``Generator.append_tokens(..., prompt_logprobs=k)``).
        temperature: 0 = greedy (argmax, ties -> lowest id); otherwise a finite number > 0.
        top_k: keep the k most likely tokens; 0 = off.
        top_p: nucleus sampling, in (0, 1]; 1 = off.
        min_p: in [0, 1): drop tokens with p < min_p * p_max; 0 = off.
        repetition_penalty: > 0, 1 = off. Seen tokens (prompt + generated): logit/penalty if the logit
            is > 0, logit*penalty otherwise.
        presence_penalty, frequency_penalty: over generated tokens only:
            ``logit -= presence * (count > 0) + frequency * count``; 0 = off; negative values reward.
        seed: same seed -> same output; None = fresh OS entropy.
        stop: stop strings (not included in the returned text). A single string is accepted.
        stop_token_ids: extra end-of-sequence ids (the caller adds the model's own eos ids).
        ignore_eos: keep generating past end-of-sequence tokens (benchmarks, exact lengths).
        logit_bias: {token id: bias} added to the logits before anything else (OpenAI's
            logit_bias: -100 bans a token, 100 all but forces it); kept as sorted pairs.
        constraint: what the reply must match (llm_onnx.runtime.constraint.Constraint: a JSON
            schema, any JSON object, a regex, a grammar, a choice); None = free text.
        keep_special: special tokens whose text stays in the reply (a chat format's markers,
            such as harmony's ``<|channel|>``, which its reader needs); the others are dropped
            as decoding drops them.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: Constraint | None = None
    keep_special: tuple[str, ...] = ()

    def validated(self) -> GenerationOptions:
        """A copy with checked values and normalised types (lists -> tuples, numpy scalars -> Python).

        Raises:
            GenerationError: one line naming the option, its value and the allowed range.
        """
        return dataclasses.replace(
            self,
            max_new_tokens=_int_option("max_new_tokens", self.max_new_tokens, minimum=0),
            temperature=_float_option("temperature", self.temperature, ">= 0 (0 = greedy)", lambda v: v >= 0),
            top_k=_int_option("top_k", self.top_k, minimum=0, note=" (0 = off)"),
            top_p=_float_option("top_p", self.top_p, "in (0, 1] (1 = off)", lambda v: 0 < v <= 1),
            min_p=_float_option("min_p", self.min_p, "in [0, 1) (0 = off)", lambda v: 0 <= v < 1),
            repetition_penalty=_float_option(
                "repetition_penalty", self.repetition_penalty, "> 0 (1 = off)", lambda v: v > 0
            ),
            presence_penalty=_float_option("presence_penalty", self.presence_penalty, "(0 = off)", None),
            frequency_penalty=_float_option("frequency_penalty", self.frequency_penalty, "(0 = off)", None),
            seed=None if self.seed is None else _int_option("seed", self.seed, minimum=0, note=" or None"),
            stop=_stop_strings(self.stop),
            stop_token_ids=_stop_token_ids(self.stop_token_ids),
            ignore_eos=_bool_option("ignore_eos", self.ignore_eos),
            logit_bias=_logit_bias(self.logit_bias),
            constraint=_constraint(self.constraint),
            keep_special=_keep_special(self.keep_special),
        )


def _bool_option(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise GenerationError(f"{name}={value!r} is not allowed: it must be true or false")
    return bool(value)


def _is_int(value: object) -> TypeGuard[numbers.Integral]:
    # bool is an int subclass, but max_new_tokens=True is a mistake, not a number.
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _int_option(name: str, value: object, *, minimum: int, note: str = "") -> int:
    if not _is_int(value) or int(value) < minimum:
        raise GenerationError(f"{name}={value!r} is not allowed: it must be an integer >= {minimum}{note}")
    return int(value)


def _float_option(name: str, value: object, allowed: str,
                  check: Callable[[float], bool] | None) -> float:
    number = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        try:
            number = float(value)
        except OverflowError:  # an int like 10**400
            pass
    # NaN fails every comparison, and inf would turn logits into NaN; both are rejected here.
    if not math.isfinite(number) or (check is not None and not check(number)):
        raise GenerationError(f"{name}={value!r} is not allowed: it must be a finite number {allowed}")
    return number


def _stop_strings(stop: object) -> tuple[str, ...]:
    if isinstance(stop, str):  # stop="</s>" means one stop string, not four one-letter ones
        stop = (stop,)
    if not isinstance(stop, Sequence):
        raise GenerationError(f"stop={stop!r} is not allowed: it must be a list of non-empty strings")
    for item in stop:
        if not isinstance(item, str) or not item:
            raise GenerationError(f"stop contains {item!r}: every stop string must be a non-empty string")
    return tuple(stop)


def _keep_special(tokens: object) -> tuple[str, ...]:
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) or \
            not all(isinstance(t, str) and t for t in tokens):
        raise GenerationError(f"keep_special={tokens!r} is not allowed: it must be a list of "
                              "special tokens' texts")
    return tuple(tokens)


def _stop_token_ids(ids: object) -> tuple[int, ...]:
    if _is_int(ids):
        ids = (ids,)
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise GenerationError(f"stop_token_ids={ids!r} is not allowed: it must be a list of integers >= 0")
    return tuple(_int_option(f"stop_token_ids[{i}]", item, minimum=0) for i, item in enumerate(ids))


def _logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    items = bias.items() if isinstance(bias, Mapping) else bias
    if isinstance(items, (str, bytes)) or not isinstance(items, (Sequence, ItemsView)):
        raise GenerationError(f"logit_bias={bias!r} is not allowed: it must map token ids to "
                              "numbers between -100 and 100")
    out: dict[int, float] = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise GenerationError(f"logit_bias entry {item!r} is not a (token id, bias) pair")
        key, value = item
        if isinstance(key, str) and key.strip().isdigit():  # JSON object keys are strings
            key = int(key)
        token = _int_option("logit_bias token id", key, minimum=0)
        out[token] = _float_option(f"logit_bias[{token}]", value, "between -100 and 100",
                                   lambda v: -100 <= v <= 100)
    return tuple(sorted(out.items()))


def _constraint(constraint: object) -> Constraint | None:
    if constraint is not None and not isinstance(constraint, Constraint):
        raise GenerationError(f"constraint={constraint!r} is not allowed: it must be a "
                              "Constraint (Constraint.json_schema(...), .regex(...), ...) or None")
    return constraint


def row_options(options: GenerationOptions, index: int) -> GenerationOptions:
    """The options of the ``index``-th of several sequences asked for together (a batch, the
    choices of one request): the same, but seed + index, so they differ yet repeat."""
    if index == 0 or options.seed is None:
        return options
    return dataclasses.replace(options, seed=options.seed + index)


def is_batch(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of prompts (texts or id lists), not one prompt."""
    if isinstance(prompt, str):
        return False
    items = list(prompt)
    return bool(items) and all(isinstance(p, str) or not isinstance(p, (int, np.integer))
                               for p in items)

