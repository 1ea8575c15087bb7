"""Checkpoints in: open a Hugging Face folder, a GGUF file or a preset with random weights, check it
against the config, and fill a Decoder tensor by tensor.

``build_model`` is the entry point: ``build_model(cfg)`` gives a weightless (meta-device) decoder for
tracing; ``build_model(cfg, source)`` a real one. Loading never holds more than one checkpoint tensor
beyond what the model itself keeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from llm_onnx.checkpoints.pooling import GGUF_POOLINGS, transformer_folder
from llm_onnx.checkpoints.relayout import family_source, is_bare_model
from llm_onnx.checkpoints.sources import (
    GGUFSource,
    RandomSource,
    SafetensorsSource,
    TensorSource,
    check_shapes,
    gguf_field,
)
from llm_onnx.checkpoints.vision import check_vision_tensors, vision_source
from llm_onnx.errors import CheckpointError
from llm_onnx.families import load_hf_config, load_vision_config
from llm_onnx.modeling.attention import hadamard
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.decoder import Decoder, Fusion
from llm_onnx.modeling.embedding import EmbeddingDecoder
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig
from llm_onnx.modeling.shapes import checkpoint_shapes

# Tokenizer and generation files carried from a Hugging Face folder into a model folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


@dataclass
class Checkpoint:
    """A model's weights (lazy), config and tokenizer, from wherever they came."""

    config: ModelConfig
    source: TensorSource
    name: str
    kind: str  # "hf" | "gguf" | "random"
    path: Path | None = None
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)  # file name -> content
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    storage_type: str | None = None  # GGUF: the type most layer projections are stored in
    # the bare model's tensors (Qwen3Model, LlamaModel: no LM head), as embedding models ship
    bare: bool = False
    gguf_pooling: str | None = None  # GGUF: its <arch>.pooling_type (embedding models)
    # the vision tower beside the text model (Qwen3-VL, Qwen3.5, Gemma 3, Gemma 4), its
    # tensors by their own names (checkpoints/vision.py); None: text only
    vision: AnyVisionConfig | None = None
    vision_source: TensorSource | None = None

    def write_tokenizer(self, folder: Path) -> list[str]:
        for fname, content in self.tokenizer_files.items():
            (folder / fname).write_bytes(content)
        return sorted(self.tokenizer_files)


def open_checkpoint(path: Path, task: str = "generate", *, text_only: bool = False) -> Checkpoint:
    """A Hugging Face checkpoint folder (config.json + safetensors) or a .gguf file. ``task``
    "embed" needs no LM head (and ignores one); a sentence-transformers folder whose model sits
    in a subfolder is read from there. A multimodal checkpoint's vision tower is read beside
    the text model (``Checkpoint.vision``) unless ``text_only`` (or ``task`` "embed")."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise CheckpointError(f"{path}: expected a Hugging Face checkpoint folder or a .gguf file.")
        return _open_gguf(path, task)
    if not any(path.iterdir()):
        raise CheckpointError(f"{path}: the checkpoint folder is empty.")
    model_folder = transformer_folder(path)  # sentence-transformers: its Transformer module's
    cfg = load_hf_config(model_folder)
    raw = SafetensorsSource(model_folder)
    source = family_source(raw, cfg)  # GPT-2/BLOOM/Falcon, bare models: canonical names
    check_tensors(cfg, source, str(model_folder), head=task != "embed")
    vision = None if text_only or task != "generate" else load_vision_config(model_folder)
    tower = None if vision is None else vision_source(vision, raw)
    if vision is not None and tower is not None:
        vision.check_decoder(cfg.hidden_size, cfg.rotary_dim, cfg.num_hidden_layers)
        check_vision_tensors(vision, tower, str(model_folder))
    files = {f: (model_folder / f).read_bytes() for f in TOKENIZER_FILES
             if (model_folder / f).is_file()}
    eos, bos = _hf_special_ids(model_folder)
    return Checkpoint(cfg, source, path.name, "hf", path, files, eos, bos,
                      bare=is_bare_model(raw) or _names_bare_class(model_folder),
                      vision=vision, vision_source=tower)


def _names_bare_class(folder: Path) -> bool:
    """Whether config.json names the bare model class (``Qwen3Model``, not ``...ForCausalLM``)."""
    try:
        archs = json.loads((folder / "config.json").read_text(encoding="utf-8")).get(
            "architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return bool(archs) and isinstance(archs[0], str) and archs[0].endswith("Model")


def _hf_special_ids(folder: Path) -> tuple[list[int], int | None]:
    eos: list[int] = []
    bos = None
    for fname in ("generation_config.json", "config.json"):
        file = folder / fname
        if not file.is_file():
            continue
        data = json.loads(file.read_text(encoding="utf-8"))
        value = data.get("eos_token_id")
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in eos:
                eos.append(v)
        if bos is None and isinstance(data.get("bos_token_id"), int):
            bos = data["bos_token_id"]
    return eos, bos


def _open_gguf(path: Path, task: str = "generate") -> Checkpoint:
    from llm_onnx.checkpoints.gguf_tokenizer import read_gguf_tokenizer

    raw = GGUFSource(path)
    source = family_source(raw, raw.cfg)  # Phi-3: fused qkv / gate|up, split as in safetensors
    check_tensors(raw.cfg, source, str(path), head=task != "embed")
    tok = read_gguf_tokenizer(raw.reader, str(path))
    files = {
        "tokenizer.json": json.dumps(tok.tokenizer_json, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": json.dumps(tok.tokenizer_config, ensure_ascii=False,
                                            indent=2).encode("utf-8"),
    }
    name = path.stem
    pooling = gguf_field(raw.reader, f"{raw.names_table.arch}.pooling_type")
    return Checkpoint(raw.cfg, source, name, "gguf", path, files, list(tok.eos_token_ids),
                      tok.bos_token_id, raw.storage_type(),
                      gguf_pooling=GGUF_POOLINGS.get(int(pooling)) if pooling is not None else None)


def random_checkpoint(cfg: ModelConfig, name: str, seed: int = 0) -> Checkpoint:
    """Seeded random weights of a preset, without a tokenizer."""
    return Checkpoint(cfg, RandomSource(cfg, seed), name, "random")


def check_tensors(cfg: ModelConfig, source: TensorSource, where: str, head: bool = True) -> None:
    """Every tensor the config needs is present with the right shape, and nothing unexpected.
    ``head`` False (an embedding export): the LM head is neither needed nor refused."""
    expected = checkpoint_shapes(cfg)
    if not head:
        expected.pop("lm_head.weight", None)
    present = set(source.names())
    missing = [n for n in expected if n not in present]
    if missing == ["lm_head.weight"]:
        raise CheckpointError(
            f"{where}: checkpoint has no LM head (lm_head.weight): it holds the bare model, as "
            "embedding models such as Qwen3-Embedding do. Export it with --task embed (or give "
            "a causal LM checkpoint to generate with).")
    if missing:
        example = f"{missing[0]} of shape {list(expected[missing[0]])}"
        own_name = getattr(source, "checkpoint_name", lambda n: n)(missing[0])  # FamilySource
        if own_name != missing[0]:
            example = f"{own_name}, read as {example}"
        raise CheckpointError(
            f"{where}: checkpoint lacks {len(missing)} tensor(s) needed by {cfg.architecture} "
            f"(e.g. {example}).")
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings or not head else set()
    extra = sorted(n for n in present - set(expected) - ignorable
                   if not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise CheckpointError(
            f"{where}: checkpoint has {len(extra)} tensor(s) the config does not describe "
            f"(e.g. {extra[0]}); is config.json for this checkpoint?")
    check_shapes(source, expected)



# ----------------------------------------------------------------------------- params from checkpoints


Producer = Callable[[TensorSource], torch.Tensor]


# Fused projections: parameter suffix -> the checkpoint projections concatenated (rows) into it.
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "gate_up_proj": ("gate_proj", "up_proj")}  # mlp.gate_up_proj, mlp.shared_expert.gate_up_proj


def param_producers(model: nn.Module) -> Iterator[tuple[str, Producer]]:
    """For each parameter of the decoder (tied weights once), how to build it from checkpoint
    tensors, in Hugging Face layout."""
    cfg = model.config
    for name, param in model.named_parameters():
        module, _, attr = name.rpartition(".")
        fused = next((parts for suffix, parts in _FUSED.items() if module.endswith(suffix)), None)
        if fused is not None:
            base = module[: -len(next(s for s in _FUSED if module.endswith(s)))]
            names = [f"{base}{part}.{attr}" for part in fused]
            yield name, (lambda src, names=names: torch.cat([src.get(n) for n in names], dim=0))
        elif name.endswith(".mlp.experts.gate_up_proj"):
            assert cfg.moe is not None
            yield name, ExpertsProducer(name.removesuffix(".gate_up_proj"),
                                        cfg.moe.num_experts, fused=True)
        elif name.endswith(".mlp.experts.down_proj"):
            assert cfg.moe is not None
            yield name, ExpertsProducer(name.removesuffix(".down_proj"), cfg.moe.num_experts,
                                        fused=False)
        elif name.endswith((".mlp.experts.gate_up_proj_bias", ".mlp.experts.down_proj_bias")):
            assert cfg.moe is not None  # gpt-oss: (E, 2I) interleaved as the rows, (E, D)
            prefix, _, part = name.rpartition(".")
            yield name, ExpertsProducer(prefix, cfg.moe.num_experts,
                                        fused=part == "gate_up_proj_bias", kind="bias")
        elif name.endswith(".self_attn.key_rotation"):  # an int8 KV cache's, not a checkpoint's
            yield name, (lambda src, d=param.shape[0]: hadamard(d))
        else:
            yield name, (lambda src, n=name: src.get(n))


class ExpertsProducer:
    """The experts of one layer in ORT's layout, from the checkpoint's per-expert tensors:
    ``expert(src, e)`` builds expert e alone (fused: gate and up rows interleaved, g0, u0, g1,
    u1, ... (2I, D); else down (D, I)); calling it builds all of them, (E, rows, K), in one
    tensor. Writers and the calibration take one expert at a time: a layer of Qwen3-30B-A3B's
    stacked experts is 1.1 GiB in bfloat16 and 2.3 GiB in float32."""

    def __init__(self, prefix: str, num_experts: int, fused: bool, kind: str = "weight") -> None:
        self.prefix, self.num_experts, self.fused = prefix, num_experts, fused
        self.kind = kind  # "weight", or "bias" (gpt-oss: (2I,) interleaved, or (D,))

    def expert(self, src: TensorSource, e: int) -> torch.Tensor:
        if not self.fused:
            return src.get(f"{self.prefix}.{e}.down_proj.{self.kind}")
        gate = src.get(f"{self.prefix}.{e}.gate_proj.{self.kind}")  # (I, D) or (I,)
        up = src.get(f"{self.prefix}.{e}.up_proj.{self.kind}")
        return torch.stack((gate, up), dim=1).reshape(2 * gate.shape[0], *gate.shape[1:])

    def __call__(self, src: TensorSource) -> torch.Tensor:
        first = self.expert(src, 0)
        out = torch.empty((self.num_experts, *first.shape), dtype=first.dtype)
        out[0] = first
        for e in range(1, self.num_experts):
            out[e] = self.expert(src, e)
        return out


def _set_param(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = getattr(module, attr)
    if tuple(old.shape) != tuple(value.shape):
        raise CheckpointError(f"tensor for {name} has shape {list(value.shape)}, expected {list(old.shape)}.")
    setattr(module, attr, nn.Parameter(value.to(old.dtype).contiguous(), requires_grad=False))


def load_weights(model: Decoder, source: TensorSource) -> Decoder:
    """Fill every parameter of ``model`` (possibly on the meta device) from ``source``."""
    for name, produce in param_producers(model):
        _set_param(model, name, produce(source))
    if model.config.tie_word_embeddings and hasattr(model, "lm_head"):
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def build_model(cfg: ModelConfig, source: TensorSource | None = None, *,
                dtype: torch.dtype = torch.float32, fusion: Fusion | None = None,
                max_positions: int | None = None, pooling: str | None = None,
                normalize: bool = False, kv_int8: bool = False,
                vision: AnyVisionConfig | None = None) -> Decoder:
    """The decoder of ``cfg``: weightless on the meta device, or filled from ``source``.

    Args:
        cfg: architecture.
        source: where weights come from (``open_checkpoint(path).source``,
            ``RandomSource(cfg, seed)``); None gives a meta-device model for tracing.
        dtype: compute dtype of projections and attention (norms and residuals stay fp32).
        fusion: which projections run as one matmul and whether RoPE is fused into attention.
        max_positions: length of the RoPE tables (defaults to the config's context).
        pooling, normalize: an embedding model instead (EmbeddingDecoder: no LM head, its
            forward pools the final hidden states).
        kv_int8: an int8 KV cache; ``source`` then also gives each attention layer's
            ``self_attn.k_scale`` and ``v_scale`` (an export's, or calibrate.kv_scale's).
        vision: the tower beside it (``Checkpoint.vision``): the decoder then takes image
            embeddings (modeling/multimodal.py).
    """
    max_positions = max_positions or cfg.max_position_embeddings
    with torch.device("meta"):
        model = Decoder(cfg, dtype=dtype, fusion=fusion, max_positions=max_positions,
                        kv_int8=kv_int8, vision=vision) \
            if pooling is None else EmbeddingDecoder(cfg, pooling=pooling, normalize=normalize,
                                                     dtype=dtype, fusion=fusion,
                                                     max_positions=max_positions)
    # The RoPE tables are computed, not loaded: make them real even on a weightless model.
    positions = cfg.positions
    if positions.position_embedding_type == "rope":
        model.model.rotary.materialize()
        if positions.rope_local_theta is not None:
            model.model.rotary_local.materialize()
    if positions.position_embedding_type == "sinusoidal":
        model.model.embed_positions.materialize()
    if source is not None:
        load_weights(model, source)
    return model.eval()


__all__ = ["Checkpoint", "ExpertsProducer", "build_model", "check_tensors", "load_weights",
           "open_checkpoint", "param_producers", "random_checkpoint"]
