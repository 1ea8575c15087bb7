"""A batched next-token sampler (numpy only); its options are ``GenerationOptions`` (options.py).

Processing order, applied to each row of logits (B, V) once per generated token:

1. penalties: repetition (HF/CTRL style, over prompt + generated tokens: a seen token's logit is
   divided by the penalty if positive, multiplied if negative), then presence and frequency
   (OpenAI style, over generated tokens only: ``logit -= presence * (count > 0) + frequency * count``);
2. temperature == 0: argmax (ties -> lowest id), nothing else applies;
3. otherwise temperature: ``z = (logit - max) / temperature`` (shifting first keeps huge logits finite);
4. top_k: keep the k largest (tokens tied with the k-th are kept too, so the result never depends on
   token order; this is what Hugging Face does);
5. top_p: keep the smallest set of most likely tokens (of what top_k left, renormalised) whose mass
   reaches p, again extended to tokens tied with the last one kept;
6. min_p: drop tokens whose probability is below ``min_p * p_max``;
7. draw one token from the renormalised distribution with the Sampler's own
   ``np.random.default_rng(seed)`` (one generator per Sampler, so concurrent requests never share
   state, and the same seed gives the same tokens).

Steps 4-6 are all thresholds on ``z``: the kept set is ``z >= t`` for one number ``t``, so no step needs
a full sort of the vocabulary (top_k uses ``np.partition``; top_p sorts only the few hundred most
likely tokens unless the distribution is very flat). NaN logits count as -inf; +inf logits share all
the probability. If penalties push every token of a row to -inf, the sampler falls back to the argmax
of the raw logits, so the chosen token never had a -inf logit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generation.options import GenerationOptions

__all__ = ["Sampler", "filter_logits"]


# ---------------------------------------------------------------------------------------------
# Pure filtering on one row
# ---------------------------------------------------------------------------------------------

_NUCLEUS_FIRST_GUESS = 256  # top-p sorts this many candidates first; a peaked distribution needs no more


class _Scratch:
    """Work arrays of one vocabulary row, reused for every token.

    Fresh 600 kB temporaries per token cost more in page faults than the arithmetic itself.
    """

    def __init__(self, n: int) -> None:
        self.z = np.empty(n, dtype=np.float32)  # scaled logits
        self.w = np.empty(n, dtype=np.float32)  # exp(z)
        self.tmp = np.empty(n, dtype=np.float32)  # partition works in place on a copy
        self.mask = np.empty(n, dtype=bool)


def _scaled_row(x: np.ndarray, temperature: float, scratch: _Scratch) -> np.ndarray | None:
    """z = (x - max) / temperature in scratch.z (max 0), or None if the row has no usable logit."""
    z = scratch.z
    m = x.max()
    if not math.isfinite(m):
        np.copyto(z, x)
        if math.isnan(m):  # a NaN logit is a model bug; treat it as "never pick"
            z[np.isnan(z)] = -np.inf
            m = z.max()
        if m == np.inf:  # +inf tokens share all the mass; everything else is impossible
            np.equal(z, np.inf, out=scratch.mask)
            z.fill(-np.inf)
            z[scratch.mask] = 0.0
            return z
        if m == -np.inf:
            return None
        x = scratch.tmp
        np.copyto(x, z)
    np.subtract(x, m, out=z)  # huge opposite logits overflow to -inf: probability 0 either way
    if temperature == 1.0:
        return z
    if 1e-30 < temperature < 1e30:
        z /= np.float32(temperature)
        return z
    # float32 would round such a temperature to 0 or inf (0/0, inf/inf = NaN); float64 does not.
    z[:] = z.astype(np.float64) / temperature
    return z


def _threshold(z: np.ndarray, options: GenerationOptions, scratch: _Scratch) -> float:
    """The t such that top_k, top_p and min_p together keep exactly ``z >= t``."""
    n = z.shape[0]
    t = -math.inf
    if 0 < options.top_k < n:
        t = _kth_largest(z, options.top_k, scratch.tmp)
    if options.top_p < 1.0:
        t = _nucleus_threshold(z, options.top_p, t, scratch)
    if options.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  z_i - z_max >= log(min_p), and z_max == 0.
        t = max(t, math.log(options.min_p))
    return t


def _kth_largest(values: np.ndarray, k: int, tmp: np.ndarray) -> float:
    """The k-th largest value (O(n) partition of a copy in tmp)."""
    n = values.shape[0]
    work = tmp[:n]
    np.copyto(work, values)
    work.partition(n - k)
    return float(work[n - k])


def _nucleus_threshold(z: np.ndarray, p: float, t_k: float, scratch: _Scratch) -> float:
    """Value of the least likely token in the smallest top set (of z >= t_k) whose mass reaches p."""
    if t_k == -math.inf:
        pool = z
    else:
        np.greater_equal(z, t_k, out=scratch.mask)
        pool = z[scratch.mask]
    e = np.exp(pool, out=scratch.w[: pool.shape[0]])
    target = p * float(e.sum(dtype=np.float64))
    n = pool.shape[0]
    m = _NUCLEUS_FIRST_GUESS
    while True:
        if m < n:  # sort only the m largest (plus ties); grow m if they do not reach the target
            cut = _kth_largest(pool, m, scratch.tmp)
            top = pool[np.greater_equal(pool, cut, out=scratch.mask[:n])]
        else:
            top = pool
        top = -np.sort(-top)
        cumulative = np.cumsum(np.exp(top), dtype=np.float64)
        i = int(np.searchsorted(cumulative, target, side="left"))
        if i < top.shape[0]:
            return float(top[i])
        if top.shape[0] >= n:  # rounding kept the total just below target: keep everything
            return float(top[-1])
        m *= 8


_CDF_BLOCK = 1024  # a cumsum over 150k floats is slow (sequential); cumsum block sums, then one block


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """Index i with P(i) = weights[i] / sum(weights), for a uniform u in [0, 1).

    One uniform draw per token (a Gumbel draw per vocabulary entry would cost V random numbers).
    Requires at least one positive weight; never returns an index of weight 0.
    """
    n = weights.shape[0]
    if n <= _CDF_BLOCK:
        return _search(weights, u * float(weights.sum(dtype=np.float64)))
    # Row sums of a (blocks, 1024) view are pairwise (accurate in float32) and need no big
    # temporary (reduceat with dtype=float64 makes a cast copy of the whole vocabulary).
    full = n - n % _CDF_BLOCK
    blocks = weights[:full].reshape(-1, _CDF_BLOCK).sum(axis=1).astype(np.float64)
    if full < n:
        blocks = np.append(blocks, weights[full:].sum(dtype=np.float64))
    cumulative = np.cumsum(blocks)
    target = u * cumulative[-1]
    b = _search(blocks, target, cumulative)
    rest = target - (cumulative[b - 1] if b else 0.0)
    return b * _CDF_BLOCK + _search(weights[b * _CDF_BLOCK : (b + 1) * _CDF_BLOCK], rest)


def _search(weights: np.ndarray, target: float, cumulative: np.ndarray | None = None) -> int:
    """First i with cumsum(weights)[i] > target, clamped to the last index of positive weight."""
    if cumulative is None:
        cumulative = np.cumsum(weights, dtype=np.float64)
    pos = min(int(np.searchsorted(cumulative, target, side="right")), weights.shape[0] - 1)
    while weights[pos] == 0.0:  # only after rounding put target past the end: step back to mass
        pos -= 1
    return pos


def _greedy_row(x: np.ndarray) -> int:
    """argmax with NaN treated as -inf; -1 if the row has no usable logit."""
    i = int(np.argmax(x))
    if math.isnan(x[i]):  # argmax returns the first NaN; look again without them
        x = np.where(np.isnan(x), -np.inf, x)
        i = int(np.argmax(x))
    return -1 if x[i] == -np.inf else i


def filter_logits(logits: np.ndarray, options: GenerationOptions) -> np.ndarray:
    """The logits the sampler draws from: steps 3-6 of the module docstring, without penalties.

    Args:
        logits: (V,) or (B, V); not modified.
        options: validated here.

    Returns:
        float32 array of the same shape: ``(logit - max) / temperature`` for kept tokens, -inf for
        dropped ones. With temperature 0 only the greedy token is kept (value 0). A row with no
        usable logit (all -inf/NaN) comes back all -inf.
    """
    options = options.validated()
    x = np.asarray(logits, dtype=np.float32)
    rows = x.reshape(-1, x.shape[-1])
    out = np.full(rows.shape, -np.inf, dtype=np.float32)
    scratch = _Scratch(rows.shape[1])
    with np.errstate(all="ignore"):
        for r in range(rows.shape[0]):
            if options.temperature == 0.0:
                i = _greedy_row(rows[r])
                if i >= 0:
                    out[r, i] = 0.0
                continue
            z = _scaled_row(rows[r], options.temperature, scratch)
            if z is not None:
                keep = z >= _threshold(z, options, scratch)
                out[r, keep] = z[keep]
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# The stateful sampler
# ---------------------------------------------------------------------------------------------


class _IdList:
    """Append-only list of token ids kept as a numpy array (amortised O(1) append, no copy to read)."""

    def __init__(self) -> None:
        self._buf = np.empty(64, dtype=np.int64)
        self._n = 0

    def append(self, token_id: int) -> None:
        if self._n == self._buf.shape[0]:
            self._grow(self._n + 1)
        self._buf[self._n] = token_id
        self._n += 1

    def extend(self, token_ids: np.ndarray) -> None:
        end = self._n + token_ids.shape[0]
        if end > self._buf.shape[0]:
            self._grow(end)
        self._buf[self._n : end] = token_ids
        self._n = end

    def _grow(self, needed: int) -> None:
        buf = np.empty(max(needed, 2 * self._buf.shape[0]), dtype=np.int64)
        buf[: self._n] = self._buf[: self._n]
        self._buf = buf

    @property
    def array(self) -> np.ndarray:
        return self._buf[: self._n]


class Sampler:
    """Picks the next token of each row of a batch; one instance per request (it owns the RNG).

    Args:
        options: generation options (validated here).
        batch_size, vocab_size: the shape of the logits passed to ``__call__``.
        prompt_ids: one list of prompt token ids per row (for the repetition penalty).
        rng: the random generator to draw from (default: a new one from ``options.seed``).

    Use: ``ids = sampler(logits)`` then ``sampler.observe(ids)`` once the tokens are accepted.
    Penalty bookkeeping is incremental: per row, a seen-mask and a count array over the vocabulary
    plus the list of distinct ids, so applying penalties costs O(distinct tokens), not O(V).
    """

    def __init__(
        self, options: GenerationOptions, batch_size: int, vocab_size: int, prompt_ids: Sequence[Sequence[int]],
        rng: np.random.Generator | None = None,
    ) -> None:
        self.options = options.validated()
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        if len(prompt_ids) != batch_size:
            raise ValueError(f"prompt_ids has {len(prompt_ids)} rows, batch_size is {batch_size}")
        self.rng = rng if rng is not None else np.random.default_rng(self.options.seed)
        self._scratch = _Scratch(vocab_size) if self.options.temperature > 0 else None
        self._repetition = self.options.repetition_penalty != 1.0
        self._presence = self.options.presence_penalty != 0.0 or self.options.frequency_penalty != 0.0
        self._seen = np.zeros((batch_size, vocab_size), dtype=bool) if self._repetition else None
        self._seen_ids = [_IdList() for _ in range(batch_size)]
        self._counts = np.zeros((batch_size, vocab_size), dtype=np.int32) if self._presence else None
        self._generated_ids = [_IdList() for _ in range(batch_size)]
        self._work: np.ndarray | None = None  # the penalised copy of the logits, reused
        if self._repetition:
            for row, ids in enumerate(prompt_ids):
                self._mark_prompt(row, np.asarray(ids, dtype=np.int64).reshape(-1))

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """(B, V) logits -> (B,) int64 token ids. The caller's array is never modified."""
        x = np.asarray(logits)
        if x.shape != (self.batch_size, self.vocab_size):
            raise ValueError(f"logits shape {x.shape} != ({self.batch_size}, {self.vocab_size})")
        with np.errstate(all="ignore"):
            raw = x
            if self._repetition or self._presence:
                x = self._penalized(x)
            if self.options.temperature == 0.0:
                chosen = np.argmax(x, axis=-1)
                # The common case is one argmax; rows with NaN or only -inf take the slow path.
                picked = x[np.arange(self.batch_size), chosen]
                if np.isfinite(picked).all():
                    return chosen.astype(np.int64, copy=False)
                return np.array([self._greedy(x[r], raw[r], r) for r in range(self.batch_size)], dtype=np.int64)
            if x.dtype != np.float32:
                x = x.astype(np.float32)
            return np.array([self._sample_row(x[r], raw[r], r) for r in range(self.batch_size)], dtype=np.int64)

    @property
    def observes(self) -> bool:
        """Whether ``observe`` records anything (a penalty is on); without one a caller may skip
        it (a token's host time between model runs counts: docs/performance.md)."""
        return self._repetition or self._presence

    def pick_one(self, logits: np.ndarray) -> int:
        """``self(logits[None])[0]`` for a one-row sampler, as a Python int: greedy without
        penalties takes one argmax and no temporaries (the common case of every decode step);
        everything else goes through ``__call__``."""
        x = np.asarray(logits)
        if self.options.temperature == 0.0 and not self.observes and self.batch_size == 1 \
                and x.shape == (self.vocab_size,):
            i = int(x.argmax())
            if math.isfinite(x[i]):  # else NaN or only -inf: __call__'s slow path
                return i
        return int(self(x[None])[0])

    def observe(self, token_ids: np.ndarray) -> None:
        """Record the tokens just generated, one per row (for the penalties)."""
        ids = np.asarray(token_ids).reshape(-1)
        if ids.shape[0] != self.batch_size:
            raise ValueError(f"observe() got {ids.shape[0]} ids for a batch of {self.batch_size}")
        if not (self._repetition or self._presence):
            return
        for row, token_id in enumerate(ids.tolist()):
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
            if self._repetition:
                self._mark_seen(row, token_id)
            if self._presence:
                assert self._counts is not None
                if self._counts[row, token_id] == 0:
                    self._generated_ids[row].append(token_id)
                self._counts[row, token_id] += 1

    def _mark_prompt(self, row: int, ids: np.ndarray) -> None:
        assert self._seen is not None
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.shape[0]:
            raise GenerationError(f"prompt token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        unique = np.unique(ids)
        self._seen[row, unique] = True
        self._seen_ids[row].extend(unique)

    def _mark_seen(self, row: int, token_id: int) -> None:
        assert self._seen is not None
        if not self._seen[row, token_id]:
            self._seen[row, token_id] = True
            self._seen_ids[row].append(token_id)

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of the logits with the penalties applied (sparse: only seen ids are touched)."""
        if self._work is None:
            self._work = np.empty((self.batch_size, self.vocab_size), dtype=np.float32)
        x = self._work
        np.copyto(x, logits)
        penalty = self.options.repetition_penalty  # float64 math: 1e-50 is 0 in float32
        presence = self.options.presence_penalty
        frequency = self.options.frequency_penalty
        for row in range(self.batch_size):
            ids = self._seen_ids[row].array
            if self._repetition and ids.shape[0]:
                v = x[row, ids].astype(np.float64)
                x[row, ids] = np.where(v > 0, v / penalty, v * penalty)  # overflow -> +-inf, handled later
            ids = self._generated_ids[row].array
            if self._presence and ids.shape[0]:
                assert self._counts is not None
                amount = presence + frequency * self._counts[row, ids]
                x[row, ids] = x[row, ids] - amount
        return x

    def _greedy(self, x: np.ndarray, raw: np.ndarray, row: int) -> int:
        i = _greedy_row(x)
        return i if i >= 0 else self._fallback(raw, row)

    def _sample_row(self, x: np.ndarray, raw: np.ndarray, row: int) -> int:
        scratch = self._scratch
        assert scratch is not None  # allocated whenever temperature > 0
        z = _scaled_row(x, self.options.temperature, scratch)
        if z is None:
            return self._fallback(raw, row)
        t = _threshold(z, self.options, scratch)
        if t == -math.inf:
            candidates = None
            weights = np.exp(z, out=scratch.w)
        else:
            candidates = np.flatnonzero(np.greater_equal(z, t, out=scratch.mask))
            weights = np.exp(z[candidates])
        pos = _inverse_cdf(weights, self.rng.random())
        return pos if candidates is None else int(candidates[pos])

    def _fallback(self, raw: np.ndarray, row: int) -> int:
        """Penalties left nothing usable: take the raw argmax, which was never -inf."""
        i = _greedy_row(np.asarray(raw, dtype=np.float32))
        if i < 0:
            raise GenerationError(
                f"the logits of batch row {row} are all -inf or NaN: the model produced no usable token"
            )
        return i
