"""Hugging Face ``tokenizers`` files rebuilt from the tokenizer a GGUF file keeps in its metadata.

A GGUF has no tokenizer.json: llama.cpp stores the vocabulary, merges or scores, token types and
special token ids under ``tokenizer.ggml.*``. This module turns them back into the tokenizer.json
and tokenizer_config.json that transformers builds for the same file
(``AutoTokenizer.from_pretrained(folder, gguf_file=name)``), so the runtime, which only has the
``tokenizers`` library, encodes and decodes exactly as transformers does.

Supported ``tokenizer.ggml.model`` values:

* ``gpt2``: byte-level BPE with the file's merges; the split regex comes from ``tokenizer.ggml.pre``.
* ``llama``: SentencePiece-style BPE with byte fallback and ``▁`` for spaces; merges come from the
  file or are derived from the vocabulary and its scores. Two architectures get transformers' own
  variant of it: ``phi3`` (the prefix ``▁`` from a normalizer, so a leading space is kept as
  written) and ``gemma``/``gemma2``/``gemma3`` (no prefix ``▁``; runs of spaces the file spells as
  real spaces respelled ``▁``; merges derived in the file's token order, which Gemma's scores do
  not follow; ``<bos>``, ``<eos>``, ``<pad>``, ``<mask>`` special).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_onnx.errors import CheckpointError

# gguf.GGUFValueType and gguf.TokenType values; plain ints keep this module free of the gguf import.
_ARRAY, _STRING, _BOOL = 9, 8, 7
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
_FLOAT_TYPES = {6, 12}
_CONTROL, _USER_DEFINED = 3, 4

_SUPPORTED_MODELS = ("gpt2", "llama")
# Architectures whose sentencepiece ("llama") vocabularies transformers reads its own way.
_SENTENCEPIECE_VARIANTS = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3"}
# transformers' GPT2Tokenizer, LlamaTokenizer and GemmaTokenizer mark their default special tokens
# as special whenever the vocabulary has them, whatever the file's token types say.
_DEFAULT_SPECIALS = {"gpt2": ("<|endoftext|>",), "llama": ("<unk>", "<s>", "</s>"),
                     "phi3": ("<unk>", "<s>", "</s>"),
                     "gemma": ("<unk>", "<bos>", "<eos>", "<pad>", "<mask>")}
_NAMED_SPECIALS = {"bos_token": "tokenizer.ggml.bos_token_id",
                   "eos_token": "tokenizer.ggml.eos_token_id",
                   "unk_token": "tokenizer.ggml.unknown_token_id",
                   "pad_token": "tokenizer.ggml.padding_token_id"}
# The ids that end a reply: eos, and llama.cpp's end-of-turn / end-of-message tokens.
_END_OF_TURN_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                     "tokenizer.ggml.eom_token_id")

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> split regex, as transformers maps them. Any other value ("default",
# "smollm", "gpt-2", ...) keeps the GPT-2 regex built into the ByteLevel pre-tokenizer.
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                     "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


@dataclass
class GGUFTokenizer:
    """The tokenizer of a GGUF file, as Hugging Face tokenizer.json and tokenizer_config.json."""

    tokenizer_json: dict
    tokenizer_config: dict
    bos_token_id: int | None
    eos_token_id: int | None
    eos_token_ids: list[int]
    chat_template: str | None

    def save(self, folder: Path) -> list[str]:
        """Write tokenizer.json and tokenizer_config.json into ``folder``; return their names."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(
            json.dumps(self.tokenizer_json, ensure_ascii=False), encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(
            json.dumps(self.tokenizer_config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return ["tokenizer.json", "tokenizer_config.json"]


def read_gguf_tokenizer(reader: Any, source: str) -> GGUFTokenizer:
    """The tokenizer described by a GGUF file's metadata.

    Args:
        reader: a ``gguf.GGUFReader`` of the file.
        source: the file's path, named in errors.

    Raises:
        CheckpointError: a tokenizer model other than gpt2/llama, or metadata that is missing,
            mistyped or inconsistent (ids outside the vocabulary, merges of unknown tokens).
    """
    meta = _Metadata(reader, source)
    kind = _tokenizer_model(meta)
    variant = (_SENTENCEPIECE_VARIANTS.get(meta.string("general.architecture", None), kind)
               if kind == "llama" else kind)
    tokens, token_types = _vocabulary(meta)
    named_ids = {name: meta.token_id(key, len(tokens)) for name, key in _NAMED_SPECIALS.items()}

    if kind == "gpt2":
        vocab, tokenizer_json = _byte_level_model(meta, tokens)
    else:
        vocab, tokenizer_json = _sentencepiece_model(meta, tokens, variant)
    special_ids = _special_ids(variant, token_types, vocab, named_ids)
    tokenizer_json["added_tokens"] = _added_tokens(tokens, token_types, vocab, special_ids)

    named = {name: tokens[i] for name, i in named_ids.items() if i is not None}
    # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise; a flag without
    # its token is dropped, as transformers drops it.
    add_bos = meta.boolean("tokenizer.ggml.add_bos_token", kind == "llama") and "bos_token" in named
    add_eos = meta.boolean("tokenizer.ggml.add_eos_token", False) and "eos_token" in named
    tokenizer_json["post_processor"] = _post_processor(
        named.get("bos_token") if add_bos else None, named.get("eos_token") if add_eos else None, named_ids)

    chat_template = meta.string("tokenizer.chat_template", None)
    config = _tokenizer_config(meta, named, chat_template, add_bos, add_eos)
    end_ids = [meta.token_id(key, len(tokens)) for key in _END_OF_TURN_KEYS]
    return GGUFTokenizer(
        tokenizer_json=tokenizer_json, tokenizer_config=config,
        bos_token_id=named_ids["bos_token"], eos_token_id=named_ids["eos_token"],
        eos_token_ids=list(dict.fromkeys(i for i in end_ids if i is not None)),
        chat_template=chat_template,
    )


def _tokenizer_model(meta: _Metadata) -> str:
    kind = meta.string("tokenizer.ggml.model")
    if kind not in _SUPPORTED_MODELS:
        raise CheckpointError(f"{meta.source}: tokenizer.ggml.model is {kind!r}, which cannot be converted; "
                              f"supported: {', '.join(_SUPPORTED_MODELS)}.")
    return kind


def _vocabulary(meta: _Metadata) -> tuple[list[str], list[int]]:
    tokens = meta.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise CheckpointError(f"{meta.source}: tokenizer.ggml.tokens is empty.")
    token_types = meta.integers("tokenizer.ggml.token_type", [1] * len(tokens))
    if len(token_types) != len(tokens):
        raise CheckpointError(f"{meta.source}: tokenizer.ggml.token_type has {len(token_types)} entries "
                              f"for the {len(tokens)} tokens of tokenizer.ggml.tokens.")
    return tokens, token_types


# ----------------------------------------------------------------------------- metadata


class _Metadata:
    """Typed access to a GGUFReader's fields, raising CheckpointError that names file and key."""

    _MISSING = object()

    def __init__(self, reader: Any, source: str) -> None:
        self.fields = reader.fields
        self.source = source

    def _get(self, key: str, default: Any, kinds: set[int], array: bool, what: str) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is self._MISSING:
                raise CheckpointError(f"{self.source}: GGUF metadata lacks {key}, needed for the tokenizer.")
            return default
        types = [int(t) for t in field.types]
        if array and types == [_ARRAY]:  # the reader records no item type for an empty array
            return []
        shape_ok = (len(types) == 2 and types[0] == _ARRAY) if array else len(types) == 1
        if not shape_ok or types[-1] not in kinds:
            raise CheckpointError(f"{self.source}: GGUF metadata {key} is not {what} (types {types}).")
        values = [self._decode(key, field.parts[i], types[-1]) for i in field.data]
        return values if array else values[0]

    def _decode(self, key: str, part: Any, kind: int) -> Any:
        if kind != _STRING:
            return part.tolist()[0]
        try:
            return bytes(part).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.source}: GGUF metadata {key} holds invalid UTF-8 ({e}).") from e

    def string(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, {_STRING}, False, "a string")

    def integer(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, _INT_TYPES, False, "an integer")

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, {_BOOL}, False, "a boolean")

    def strings(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, {_STRING}, True, "an array of strings")

    def integers(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, _INT_TYPES, True, "an array of integers")

    def numbers(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, _FLOAT_TYPES | _INT_TYPES, True, "an array of numbers")

    def token_id(self, key: str, vocab_size: int) -> int | None:
        """An optional token id, checked against the vocabulary's size."""
        token_id = self.integer(key, None)
        if token_id is not None and not 0 <= token_id < vocab_size:
            raise CheckpointError(f"{self.source}: GGUF metadata {key} is {token_id}, outside the "
                                  f"vocabulary of {vocab_size} tokens (tokenizer.ggml.tokens).")
        return token_id


# ----------------------------------------------------------------------------- models


def _byte_level_model(meta: _Metadata, tokens: list[str]) -> tuple[dict[str, int], dict]:
    """gpt2: byte-level BPE; tokens outside the byte alphabet (raw added tokens) are re-spelled."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): i
             for i, token in enumerate(tokens)}
    merges = _file_merges(meta, vocab)
    if merges is None:
        raise CheckpointError(f"{meta.source}: GGUF metadata lacks tokenizer.ggml.merges, needed by "
                              f"tokenizer.ggml.model 'gpt2'.")
    split = PRE_TOKENIZER_SPLITS.get(meta.string("tokenizer.ggml.pre", ""))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": split is None}
    pre_tokenizer = byte_level if split is None else {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
        byte_level]}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
             "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": merges}
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return vocab, _tokenizer_json(pre_tokenizer, model, decoder)


def _sentencepiece_model(meta: _Metadata, tokens: list[str],
                         variant: str = "llama") -> tuple[dict[str, int], dict]:
    """BPE over ``▁``-spelled text with byte fallback, as transformers reads the ``variant``:
    LlamaTokenizer (llama), its phi3 form, or GemmaTokenizer (gemma)."""
    gemma = variant == "gemma"
    if gemma:  # runs of spaces, stored as spaces, are looked up as "▁" runs
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = _file_merges(meta, vocab)
    if merges is None and gemma:  # Gemma's merge order is its token order, not its scores
        merges = _merges_from_scores(vocab, {token: -float(i) for i, token in enumerate(tokens)})
    elif merges is None:
        scores = meta.numbers("tokenizer.ggml.scores", None)
        if scores is None or len(scores) != len(tokens):
            raise CheckpointError(f"{meta.source}: tokenizer.ggml.scores is missing or does not have one "
                                  f"score per token, and there is no tokenizer.ggml.merges to use instead.")
        merges = _merges_from_scores(vocab, dict(zip(tokens, scores)))
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    normalizer: dict | None = None
    if variant == "phi3":  # "▁" before the text, then every space: a leading space is kept
        normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, spaces]}
        pre_tokenizer = None
    elif gemma:  # no prefix "▁" at all
        normalizer = spaces
        pre_tokenizer = {"type": "Split", "pattern": {"String": " "},
                         "behavior": "MergedWithPrevious", "invert": False}
    else:
        # transformers ignores tokenizer.ggml.add_space_prefix and always prepends "▁" to the first word.
        pre_tokenizer = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    model = {"type": "BPE", "dropout": None,
             "unk_token": "<unk>" if gemma and "<unk>" in vocab else None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
             "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges}
    decoders = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if not gemma:  # the prefix "▁" comes off again
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    decoder = {"type": "Sequence", "decoders": decoders}
    return vocab, _tokenizer_json(pre_tokenizer, model, decoder, normalizer)


def _tokenizer_json(pre_tokenizer: dict | None, model: dict, decoder: dict,
                    normalizer: dict | None = None) -> dict:
    """The tokenizer.json layout; added tokens and the post-processor are filled in later."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": decoder, "model": model}


def _file_merges(meta: _Metadata, vocab: dict[str, int]) -> list[list[str]] | None:
    """The file's merges as pairs, checked here because ``tokenizers`` panics on a bad one."""
    merges = meta.strings("tokenizer.ggml.merges", None)
    if merges is None:
        return None
    pairs = [merge.split(" ") for merge in merges]
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not all(piece in vocab for piece in (*pair, "".join(pair))):
            raise CheckpointError(f"{meta.source}: tokenizer.ggml.merges[{i}] is {merges[i]!r}, not two "
                                  f"tokens of the vocabulary, separated by one space, that make a third.")
    return pairs


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[list[str]]:
    """Merges implied by a scored vocabulary: every split of a token into two vocabulary tokens,
    best score first (SentencePiece merges the pair whose result scores highest).

    Ties are ordered as transformers orders them (longer left piece first, then vocabulary order),
    since the order decides which of two equally scored merges BPE applies.
    """
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, score in scores.items():
        splits = [(token[:k], token[k:]) for k in range(1, len(token))]
        splits = sorted(((left, right) for left, right in splits if left in vocab and right in vocab),
                        key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked += [(score, len(left), len(right), left, right) for left, right in splits]
    ranked.sort(key=lambda entry: entry[:3], reverse=True)
    return [[left, right] for _, _, _, left, right in ranked]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: printable bytes stand for themselves, the rest map past U+00FF."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in spelling):
        spelling[b] = chr(256 + extra)
    return spelling


# ----------------------------------------------------------------------------- special tokens


def _special_ids(variant: str, token_types: list[int], vocab: dict[str, int],
                 named_ids: dict[str, int | None]) -> set[int]:
    """Ids of the tokens that are special (dropped by ``skip_special_tokens``), as transformers has them.

    Control tokens and the builder's defaults that the vocabulary has are special. So are the named
    tokens (bos, eos, unk, pad), unless the file marks one user-defined: transformers adds those as
    plain tokens before it gets to the named ones, and then leaves them plain.
    """
    ids = {i for i, token_type in enumerate(token_types) if token_type == _CONTROL}
    ids |= {i for i in named_ids.values() if i is not None and token_types[i] != _USER_DEFINED}
    # Added as special before the user-defined tokens; tokenizers keeps skipping a token once added
    # as special, even if transformers' own tokenizer.json then says "special": false.
    ids |= {vocab[token] for token in _DEFAULT_SPECIALS[variant] if token in vocab}
    return ids


def _added_tokens(tokens: list[str], token_types: list[int], vocab: dict[str, int],
                  special_ids: set[int]) -> list[dict]:
    """Special and user-defined tokens, which must match whole in the text.

    User-defined tokens (like ``<think>``) are added but not special, as transformers does, so
    ``skip_special_tokens`` keeps them. A token is only added under the spelling the vocabulary
    has it: ``tokenizers`` would give any other spelling a new id beyond the model's vocabulary.
    """
    added = []
    for i, token in enumerate(tokens):
        special = i in special_ids
        if not (special or token_types[i] == _USER_DEFINED) or vocab.get(token) != i:
            continue
        added.append({"id": i, "content": token, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": special})
    return added


def _post_processor(bos: str | None, eos: str | None, named_ids: dict[str, int | None]) -> dict:
    """Template adding BOS/EOS where the file asks for them (``None`` adds nothing)."""
    def piece(token: str, type_id: int) -> dict:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> list[dict]:
        return [*([piece(bos, type_id)] if bos else []), {"Sequence": {"id": name, "type_id": type_id}},
                *([piece(eos, type_id)] if eos else [])]

    specials = {}
    for token, name in ((bos, "bos_token"), (eos, "eos_token")):
        if token:
            specials[token] = {"id": token, "ids": [named_ids[name]], "tokens": [token]}
    return {"type": "TemplateProcessing", "single": sequence("A", 0),
            "pair": sequence("A", 0) + sequence("B", 1), "special_tokens": specials}


def _tokenizer_config(meta: _Metadata, named: dict[str, str], chat_template: str | None,
                      add_bos: bool, add_eos: bool) -> dict:
    """tokenizer_config.json; its class and cleanup flag also let transformers load the folder as-is."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **named,
                              "add_bos_token": add_bos, "add_eos_token": add_eos,
                              "clean_up_tokenization_spaces": False, "chat_template": chat_template}
    architecture = meta.string("general.architecture", None)
    context_length = meta.integer(f"{architecture}.context_length", None) if architecture else None
    if context_length is not None:
        config["model_max_length"] = context_length
    return config

