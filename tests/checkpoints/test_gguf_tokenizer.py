"""GGUF tokenizer metadata -> tokenizer.json: must encode and decode exactly as transformers does when it
loads the same GGUF (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``), the reference."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import pytest
import transformers
from tokenizers import Tokenizer

from llm_onnx.checkpoints.gguf_tokenizer import GGUFTokenizer, read_gguf_tokenizer
from llm_onnx.errors import CheckpointError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # gguf.TokenType

SAMPLES = [
    "Hello, world! How are you today?",
    "Le café était très agréable, n'est-ce pas ? À bientôt, ça ira. Où est l'hôtel ?",
    "Grüße aus München! Die Straße ist schön; Äpfel, Öl und Übermut.",
    "我们今天下午去公园散步吧，天气很好。",
    "東京は日本の首都です。ひらがなとカタカナと漢字。",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Привет, мир! Как у тебя дела? Ёжик.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷",
    "def f(x):\n\treturn x  +  1\n\n\n    # two  spaces\r\n\tend\t\t",
    "12345 3.14159 1,000,000 2024-01-01 x1234y",
    "I'm, you're, they'll, we'd, it's, DON'T, She'S",
    "   leading and trailing spaces   ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x<|im_end|><|im_end|>",
    "<|im_start|<|im_end|>|> <|im_start", "",
]


def _ours(tokenizer: GGUFTokenizer) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(tokenizer.tokenizer_json))


def _read(path: Path) -> GGUFTokenizer:
    return read_gguf_tokenizer(gguf.GGUFReader(str(path)), str(path))


def _transformers_tokenizer(path: Path):
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _assert_encodes_alike(ours: Tokenizer, theirs, texts: list[str]) -> None:
    for text in texts:
        assert ours.encode(text, add_special_tokens=False).ids == theirs.encode(
            text, add_special_tokens=False), text
        assert ours.encode(text).ids == theirs.encode(text), text


def _assert_decodes_alike(ours: Tokenizer, theirs, vocab_size: int, special_ids: list[int],
                          seed: int, count: int = 200) -> None:
    rng = random.Random(seed)
    for _ in range(count):
        ids = [rng.choice(special_ids) if rng.random() < 0.15 else rng.randrange(vocab_size)
               for _ in range(rng.randint(1, 24))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip), (ids, skip)


# ----------------------------------------------------------------------------- synthetic GGUFs


def _write_gguf(path: Path, tokens: list[str], token_types: list[int], *, model: str,
                architecture: str = "llama", **metadata) -> Path:
    """A GGUF with only tokenizer metadata (and the few config keys transformers reads), no tensors."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    adders = {"pre": writer.add_tokenizer_pre, "scores": writer.add_token_scores,
              "merges": writer.add_token_merges, "bos": writer.add_bos_token_id,
              "eos": writer.add_eos_token_id, "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id,
              "eot": writer.add_eot_token_id, "add_bos": writer.add_add_bos_token,
              "add_space_prefix": writer.add_add_space_prefix, "chat_template": writer.add_chat_template}
    for key, value in metadata.items():
        adders[key](value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# SentencePiece BPE pieces -> score; equal scores are deliberate, to check the order of tied merges.
SP_PIECES = {"▁t": -1.0, "he": -1.0, "▁the": -2.0, "in": -3.0, "▁a": -3.0, "er": -4.0, "or": -5.0,
             "▁w": -5.0, "▁wor": -6.0, "ld": -7.0, "▁world": -8.0, "ll": -9.0, "llo": -10.0, "▁he": -10.0,
             "▁hello": -11.0, "▁▁": -12.0, "▁▁▁▁": -12.0, "ing": -13.0, "▁in": -13.0, "▁é": -14.0}
SP_CHARS = "▁etaoinshrdlwcugéHW"
SP_TEXTS = ["hello world", " hello  the world", "Hello wörld 中 <|user|>hi<|end|></s>",
            "the    thing\nin a wo<s>rld", "<unk>é€", "   ", ""]


def _llama_vocab() -> tuple[list[str], list[int], list[float]]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SP_PIECES, *SP_CHARS,
              "<|user|>", "<|end|>"]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * (len(SP_PIECES) + len(SP_CHARS)),
             USER_DEFINED, CONTROL]
    scores = [0.0] * 259 + list(SP_PIECES.values()) + [-100.0 - i for i in range(len(SP_CHARS))] + [0.0] * 2
    return tokens, types, scores


def _random_texts(alphabet: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(count)]


@pytest.mark.parametrize("with_merges", [False, True], ids=["merges-from-scores", "merges-in-file"])
def test_llama_sentencepiece_matches_transformers(tmp_path: Path, with_merges: bool):
    tokens, types, scores = _llama_vocab()
    merges = ["▁ t", "h e", "▁t he", "▁ w", "o r", "▁w or", "l d", "▁wor ld"]
    extra = {"merges": merges} if with_merges else {}
    path = _write_gguf(tmp_path / "sp.gguf", tokens, types, model="llama", scores=scores, bos=1, eos=2,
                       unk=0, eot=len(tokens) - 1, chat_template="{{ messages[0]['content'] }}<|end|>",
                       **extra)
    ours, theirs = _read(path), _transformers_tokenizer(path)

    assert (ours.bos_token_id, ours.eos_token_id, ours.eos_token_ids) == (1, 2, [2, len(tokens) - 1])
    assert ours.tokenizer_config["add_bos_token"] is True  # llama.cpp's default for sentencepiece
    assert ours.chat_template == theirs.chat_template
    alphabet = ["▁", " ", "  ", "\n", "h", "e", "l", "o", "w", "r", "d", "t", "i", "n", "g", "a", "é", "ö",
                "中", "H", "<s>", "</s>", "<|user|>", "<|end|>", "<unk>"]
    tokenizer = _ours(ours)
    _assert_encodes_alike(tokenizer, theirs, SP_TEXTS + _random_texts(alphabet, 300, seed=1))
    _assert_decodes_alike(tokenizer, theirs, len(tokens), [0, 1, 2, len(tokens) - 2, len(tokens) - 1], seed=2)
    assert tokenizer.encode("中").tokens == ["<s>", "▁", "<0xE4>", "<0xB8>", "<0xAD>"]  # byte fallback


def _gemma_vocab() -> tuple[list[str], list[int], list[float]]:
    """Gemma's layout: <pad> <eos> <bos> <unk> <mask> first, turn markers, runs of spaces stored as
    spaces (one plain, one user-defined), and scores that disagree with the token order."""
    tokens, types, scores = _llama_vocab()
    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    head_types = [CONTROL, CONTROL, CONTROL, UNKNOWN, USER_DEFINED, CONTROL, CONTROL]
    body = [(t, k, sc) for t, k, sc in zip(tokens, types, scores) if t not in ("<unk>", "<s>", "</s>")]
    body += [("  ", NORMAL, -0.5), ("   ", USER_DEFINED, -0.25)]
    rng = random.Random(6)
    return (head + [t for t, _, _ in body], head_types + [k for _, k, _ in body],
            [0.0] * len(head) + [sc if k != NORMAL else rng.uniform(-20, 0) for _, k, sc in body])


@pytest.mark.parametrize("architecture", ["phi3", "gemma3"])
def test_sentencepiece_variants_match_transformers(tmp_path: Path, architecture: str):
    """Phi-3 and Gemma vocabularies, which transformers does not read as plain llama ones."""
    gemma = architecture == "gemma3"
    tokens, types, scores = _gemma_vocab() if gemma else _llama_vocab()
    ids = {t: i for i, t in enumerate(tokens)}
    bos, eos = (ids["<bos>"], ids["<eos>"]) if gemma else (1, 2)
    path = _write_gguf(tmp_path / "sp.gguf", tokens, types, model="llama", architecture=architecture,
                       scores=scores, bos=bos, eos=eos, unk=ids["<unk>"])
    ours, theirs = _read(path), _transformers_tokenizer(path)
    alphabet = ["▁", " ", "  ", "   ", "\n", "h", "e", "l", "o", "w", "r", "d", "t", "i", "n", "g", "a",
                "é", "中", "H", "<|user|>", "<|end|>", "<unk>",
                *(["<bos>", "<eos>", "<mask>", "<start_of_turn>", "<pad>"] if gemma else ["<s>", "</s>"])]
    tokenizer = _ours(ours)
    _assert_encodes_alike(tokenizer, theirs, SP_TEXTS + _random_texts(alphabet, 300, seed=7))
    specials = [ids[t] for t in ("<unk>", "<|user|>", "<|end|>")] + (
        [ids[t] for t in ("<bos>", "<eos>", "<pad>", "<mask>", "<end_of_turn>")] if gemma else [1, 2])
    _assert_decodes_alike(tokenizer, theirs, len(tokens), specials, seed=8)
    # What sets the variants apart, and can fail: the leading space (phi3 keeps it as written,
    # llama's Metaspace does not) and Gemma's missing prefix and respelled space runs.
    if gemma:
        assert tokenizer.encode("hello  world", add_special_tokens=False).tokens[:2] == ["he", "llo"]
        assert "▁▁" in tokenizer.encode("a  b", add_special_tokens=False).tokens
    else:
        assert tokenizer.encode(" hello", add_special_tokens=False).tokens == ["▁", "▁hello"]


def test_llama_respects_add_bos_token_false(tmp_path: Path):
    tokens, types, scores = _llama_vocab()
    path = _write_gguf(tmp_path / "sp.gguf", tokens, types, model="llama", scores=scores, bos=1, eos=2,
                       add_bos=False)
    tokenizer = _read(path)
    assert tokenizer.tokenizer_config["add_bos_token"] is False
    ours = _ours(tokenizer)
    assert ours.encode("hello").ids == ours.encode("hello", add_special_tokens=False).ids


# Byte-level vocabulary: the 256 byte symbols, then one token per merge, then added tokens.
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ Ġ",
              "ĠĠ ĠĠ", "1 2", "12 3", "Ċ Ċ", "Ġ 1", "Ã ©", "Ġ H", "ĠH e", "l l", "ĠHe ll", "ĠHell o", "' s"]
BPE_ADDED = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
             ("<think>", USER_DEFINED), ("</think>", USER_DEFINED),
             ("<|my token|>", CONTROL)]  # a raw space: llama.cpp mislabels, transformers leaves it out


def _byte_symbols() -> list[str]:
    """GPT-2's spelling of bytes 0..255: printable Latin-1 as itself, the others from U+0100 on."""
    printable = [b for b in range(256) if chr(b).isprintable() and b != 0x20 and b != 0xAD]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


def _byte_level_vocab() -> tuple[list[str], list[int]]:
    tokens = _byte_symbols() + [m.replace(" ", "") for m in BPE_MERGES]
    tokens += [token for token, _ in BPE_ADDED]
    types = [NORMAL] * (256 + len(BPE_MERGES)) + [kind for _, kind in BPE_ADDED]
    return tokens, types


@pytest.mark.parametrize("pre", ["default", "smollm", "llama-bpe", "qwen2"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path: Path, pre: str):
    tokens, types = _byte_level_vocab()
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    path = _write_gguf(tmp_path / "bpe.gguf", tokens, types, model="gpt2", pre=pre, merges=BPE_MERGES,
                       bos=start, eos=end, add_bos=pre == "qwen2")
    ours, theirs = _read(path), _transformers_tokenizer(path)
    tokenizer = _ours(ours)
    assert ours.tokenizer_config["add_bos_token"] is (pre == "qwen2")
    alphabet = [" ", "  ", "\n", "\t", "h", "e", "l", "o", "w", "r", "d", "t", "1", "2", "3", "4", "'s", "é",
                "中", "😀", "H", ".", "<|im_start|>", "<|im_end|>", "<think>", "<|my token|>", "<|endoftext|>"]
    _assert_encodes_alike(tokenizer, theirs, SAMPLES + _random_texts(alphabet, 200, seed=3))
    _assert_decodes_alike(tokenizer, theirs, len(tokens), list(range(len(tokens) - 6, len(tokens))), seed=4)
    assert tokenizer.decode(tokenizer.encode("<think>a</think><|im_end|>").ids,
                            skip_special_tokens=True) == "<think>a</think>"


def test_user_defined_tokens_are_special_only_where_transformers_makes_them(tmp_path: Path):
    # A user-defined pad token stays plain; GPT2Tokenizer's default "<|endoftext|>" is special even
    # when the file marks it user-defined (transformers adds it as special first).
    tokens, types = _byte_level_vocab()
    types[tokens.index("<|endoftext|>")] = USER_DEFINED
    path = _write_gguf(tmp_path / "bpe.gguf", tokens, types, model="gpt2", pre="qwen2", merges=BPE_MERGES,
                       eos=tokens.index("<|im_end|>"), pad=tokens.index("<think>"))
    ours, theirs = _ours(_read(path)), _transformers_tokenizer(path)
    text = "a<think>b<|endoftext|>c<|im_end|>"
    _assert_encodes_alike(ours, theirs, [text])
    ids = ours.encode(text).ids
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=True) == "a<think>bc"


def test_byte_level_never_adds_ids_beyond_the_vocabulary(tmp_path: Path):
    # transformers adds GPT2Tokenizer's default "<|endoftext|>" as a new id when the vocabulary
    # lacks it (Llama 3 files); the model has no embedding for such an id, so we do not.
    tokens, types = _byte_level_vocab()
    keep = [i for i, token in enumerate(tokens) if token != "<|endoftext|>"]
    tokens, types = [tokens[i] for i in keep], [types[i] for i in keep]
    path = _write_gguf(tmp_path / "bpe.gguf", tokens, types, model="gpt2", pre="llama-bpe", merges=BPE_MERGES)
    tokenizer = _ours(_read(path))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == len(tokens)
    assert max(tokenizer.encode("a<|endoftext|>b<|my token|>").ids) < len(tokens)


# ----------------------------------------------------------------------------- errors


def test_unsupported_tokenizer_model_names_file_and_field(tmp_path: Path):
    path = _write_gguf(tmp_path / "bert.gguf", ["[PAD]", "a"], [CONTROL, NORMAL], model="bert")
    with pytest.raises(CheckpointError, match=r"bert\.gguf.*tokenizer\.ggml\.model.*gpt2, llama") as info:
        _read(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("problem", ["bos out of range", "no scores", "bad merge"])
def test_bad_metadata_raises_checkpoint_error(tmp_path: Path, problem: str):
    tokens, types, scores = _llama_vocab()
    metadata = {"bos out of range": dict(scores=scores, bos=len(tokens)), "no scores": dict(bos=1),
                "bad merge": dict(merges=["▁ t", "▁t zz"])}[problem]
    path = _write_gguf(tmp_path / "bad.gguf", tokens, types, model="llama", **metadata)
    with pytest.raises(CheckpointError, match=r"bad\.gguf.*tokenizer\.ggml\."):
        _read(path)


# ----------------------------------------------------------------------------- SmolLM2-135M-Instruct


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf: Path) -> GGUFTokenizer:
    return _read(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2_gguf: Path):
    return _transformers_tokenizer(smollm2_gguf)


def test_smollm2_special_tokens_and_save(smollm2_tokenizer: GGUFTokenizer, tmp_path: Path):
    assert smollm2_tokenizer.tokenizer_config["bos_token"] == "<|im_start|>"
    assert (smollm2_tokenizer.bos_token_id, smollm2_tokenizer.eos_token_id) == (1, 2)
    assert smollm2_tokenizer.eos_token_ids == [2]
    assert smollm2_tokenizer.tokenizer_config["model_max_length"] == 8192
    assert smollm2_tokenizer.chat_template.startswith("{% for message in messages %}")
    assert smollm2_tokenizer.save(tmp_path) == ["tokenizer.json", "tokenizer_config.json"]

    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = tokenizer.encode("Hello <|im_start|>user\nHi<|im_end|>").ids
    assert ids == [19556, 216, 1, 4093, 198, 26843, 2]  # what transformers gives
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Hello user\nHi"
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config == smollm2_tokenizer.tokenizer_config


@pytest.mark.slow
def test_smollm2_encodes_like_transformers(smollm2_tokenizer: GGUFTokenizer, smollm2_transformers):
    _assert_encodes_alike(_ours(smollm2_tokenizer), smollm2_transformers, SAMPLES)


@pytest.mark.slow
def test_smollm2_decodes_like_transformers(smollm2_tokenizer: GGUFTokenizer, smollm2_transformers):
    tokenizer = _ours(smollm2_tokenizer)
    _assert_decodes_alike(tokenizer, smollm2_transformers, tokenizer.get_vocab_size(), list(range(17)),
                          seed=5, count=500)
    for text in SAMPLES:
        ids = tokenizer.encode(text).ids
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == smollm2_transformers.decode(
                ids, skip_special_tokens=skip)


@pytest.mark.slow
def test_smollm2_chat_template_and_ids_match_transformers(smollm2_tokenizer: GGUFTokenizer,
                                                          smollm2_transformers):
    theirs = smollm2_transformers
    assert smollm2_tokenizer.chat_template == theirs.chat_template
    assert smollm2_tokenizer.tokenizer_config["chat_template"] == theirs.chat_template
    assert (smollm2_tokenizer.bos_token_id, smollm2_tokenizer.eos_token_id) == (theirs.bos_token_id,
                                                                                theirs.eos_token_id)
    config = smollm2_tokenizer.tokenizer_config
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        theirs.bos_token, theirs.eos_token, theirs.pad_token, theirs.unk_token)
    assert (config["add_bos_token"], config["add_eos_token"]) == (theirs.add_bos_token, theirs.add_eos_token)
