"""`llm-onnx bench`."""

from __future__ import annotations

from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main
from llm_onnx.cli.generating import speculative_options


@main.command()
@click.option("--model", type=click.Path(path_type=Path),
              help="Model folder. Default: the default model (exported on first use).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs after one warm-up; medians are reported with min and max.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
@click.option("--prompt-ids", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="JSON list of token ids to use as the prompt (same ids across systems).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw decode tok/s against context length and batch into this PNG.")
@click.option("--profile", is_flag=True,
              help="Also show where one prefill and a decode step spend their time, by op type "
                   "(ONNX Runtime's profiler, in a separate session after the timed runs).")
@speculative_options
@_handle_errors
def bench(model, prompt_len, new_tokens, batch, repeat, threads, provider, prompt_ids, as_json,
          plot, profile, speculative, draft_model, num_speculative_tokens) -> None:
    """Measure time to first token, prefill and decode speed, peak memory, and the decode speed
    the machine's memory bandwidth allows.

    \b
    Examples:
      llm-onnx bench
      llm-onnx bench --model models/qwen3-8b-int4 --prompt-len 512 --new-tokens 64 --json
      llm-onnx bench --model models/smollm2-int8 --plot decode.png
      llm-onnx bench --model models/smollm2-int8 --profile
      llm-onnx bench --speculative ngram --prompt-ids edit-prompt-ids.json

    bench measures plain decoding unless --speculative or --draft-model is given (a random
    prompt gives prompt lookup nothing to draft; give --prompt-ids of a real task).
    """
    import json as _json

    from llm_onnx.bench import (
        CURVE_BATCHES,
        BenchConfig,
        add_profile,
        curve_contexts,
        decode_curve,
        peak_rss_mib,
        plot_curve,
        profile_model,
        profile_table,
        pyplot,
        run_bench,
        to_json,
    )
    from llm_onnx.errors import GenerationError
    from llm_onnx.runtime import Model

    if plot is not None:
        pyplot()  # bad options are reported now, not after the export or the measuring
    ids = None
    if prompt_ids is not None:
        try:
            ids = _json.loads(prompt_ids.read_text(encoding="utf-8"))
        except ValueError as e:
            raise GenerationError(f"{prompt_ids}: not a JSON list of token ids ({e}).") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise GenerationError(f"{prompt_ids}: expected a JSON list of integers.")
    if model is None:
        from llm_onnx.default_model import default_model_folder

        model = default_model_folder(progress=True, provider=provider)
    before_load = peak_rss_mib()
    loaded = Model.load(model, provider=provider, threads=threads,
                        speculative=speculative or ("off" if draft_model is None else None),
                        draft_model=draft_model, num_speculative_tokens=num_speculative_tokens)
    cfg = BenchConfig(prompt_len=prompt_len, new_tokens=new_tokens, batch=batch, repeat=repeat,
                      prompt_ids=ids)
    result = run_bench(loaded, cfg, before_load)
    if plot is not None:
        points = decode_curve(loaded, curve_contexts(loaded.context_length), list(CURVE_BATCHES))
        result.data["decode_curve"] = points
        plot_curve(points, plot, f"{result.data['model']} [{result.data['precision']}]")
    text = result.table()
    if profile:
        add_profile(result, profile_model(model, cfg, threads=threads, provider=provider))
        text += "\n\n" + profile_table(result.data["profile"], result.data["memory_bandwidth_gb_s"])
    click.echo(to_json(result) if as_json else text)
