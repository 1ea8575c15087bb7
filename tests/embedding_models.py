"""Tiny random embedding models laid out as sentence-transformers folders (modules.json, the
Pooling module's config.json, a Normalize module), made with transformers: the references of the
embedding tests, read back by sentence-transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llm_onnx.families import get_config
from llm_onnx.modeling.config import ModelConfig
from tests.hf_models import hf_config_dict, make_hf_model

EOS = "<|endoftext|>"
POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                "lasttoken": "pooling_mode_lasttoken"}


def save_bare_model(cfg: ModelConfig, folder: Path, seed: int = 0) -> None:
    """The bare model class of ``cfg``'s family (Qwen3Model: no LM head, no ``model.`` prefix),
    as embedding models ship it, with the random weights make_hf_model draws."""
    import transformers

    causal = make_hf_model(cfg, seed)
    bare_class = cfg.architecture.replace("ForCausalLM", "Model")
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    config = getattr(transformers, type(causal.config).__name__)(**fields)
    config.architectures = [bare_class]
    bare = getattr(transformers, bare_class)(config).eval()
    bare.load_state_dict(causal.model.state_dict())
    bare.save_pretrained(folder)


def save_tokenizer(folder: Path, vocab_size: int, padding_side: str = "right") -> None:
    """A word-level tokenizer ("t0" ... split on whitespace) whose last id is an end-of-text
    token appended to every text by its post-processor, as Qwen3-Embedding's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab[EOS] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([EOS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, vocab_size - 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
        "padding_side": padding_side, "model_max_length": 128}))


def save_sentence_transformers(cfg: ModelConfig, folder: Path, pooling: str, normalize: bool,
                               *, bare: bool, seed: int = 0, max_seq_length: int = 128,
                               padding_side: str = "right") -> Path:
    """A sentence-transformers folder: Transformer (the model here) -> Pooling (``pooling``:
    lasttoken, mean or cls) -> Normalize (with ``normalize``)."""
    folder.mkdir(parents=True, exist_ok=True)
    if bare:
        save_bare_model(cfg, folder, seed)
    else:
        make_hf_model(cfg, seed).save_pretrained(folder)
    save_tokenizer(folder, cfg.vocab_size, padding_side)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": cfg.embed_width, "include_prompt": True,
         **{key: mode == pooling for mode, key in POOLING_KEYS.items()}}))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))
    return folder


def qwen3_embedding(folder: Path, seed: int = 0) -> Path:
    """Qwen3-Embedding's layout: the bare Qwen3Model, last-token pooling, normalised, its
    tokenizer padding on the left."""
    return save_sentence_transformers(get_config("qwen3_tiny"), folder, "lasttoken", True,
                                      bare=True, seed=seed, padding_side="left")


def llama_mean(folder: Path, seed: int = 0) -> Path:
    """A causal Llama checkpoint (LM head and all) mean-pooled, not normalised."""
    return save_sentence_transformers(get_config("llama_tiny"), folder, "mean", False,
                                      bare=False, seed=seed)


def reference(folder: Path, texts: list[str], batch_size: int = 32):
    """sentence-transformers' embeddings of ``texts`` (float32 numpy, (N, E))."""
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True)
