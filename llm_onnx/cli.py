"""llm-onnx command line: a thin layer over the library (each command wraps one function).

Heavy imports (torch, onnxruntime) happen inside the commands, so `--help` stays instant.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from llm_onnx import __version__
from llm_onnx.errors import LlmOnnxError
from llm_onnx.export.options import PRECISIONS
from llm_onnx.families import PRESETS


def _handle_errors(func):
    """Library errors become one line on stderr and exit code 1; --debug shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        debug = (ctx.find_root().params or {}).get("debug", False)
        try:
            return func(*args, **kwargs)
        except LlmOnnxError as e:
            if debug:
                raise
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            if debug:
                raise
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except MemoryError:
            if debug:
                raise
            raise click.ClickException("out of memory; try a smaller --max-seq-len or batch, or "
                                       "another precision.") from None

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.version_option(__version__, prog_name="llm-onnx")
def main(debug: bool) -> None:
    """Compile decoder-only LLMs to ONNX and run them with ONNX Runtime.

    \b
    Examples:
      llm-onnx generate "What is the capital of France?"
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --out models/qwen3-8b-int4
      llm-onnx export --config qwen3_8b --random-weights --precision fp16
      llm-onnx chat --model models/qwen3-8b-int4
      llm-onnx bench --model models/qwen3-8b-int4 --prompt-len 128 --new-tokens 128
      llm-onnx serve --model models/qwen3-8b-int4 --port 8000
    """


def _default_precision() -> str:
    from llm_onnx.runtime.providers import cuda_status

    return "fp16" if cuda_status()[0] else "int8"


@main.command()
@click.option("--config", "config_name", metavar="NAME",
              help=f"A named preset: {', '.join(sorted(PRESETS))}.")
@click.option("--checkpoint", type=click.Path(path_type=Path),
              help="A Hugging Face checkpoint folder (config.json + safetensors) or a .gguf file.")
@click.option("--random-weights", is_flag=True,
              help="With --config: seeded random weights of the preset's full shape.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-weights.")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="Weights precision. Default: fp16 with a usable CUDA GPU, else int8.")
@click.option("--out", type=click.Path(path_type=Path),
              help="Model folder to write. Default: models/<name>-<precision>.")
@click.option("--max-seq-len", type=click.IntRange(min=2),
              help="Context length the model supports. Default: the model's own.")
@click.option("--block-size", type=click.Choice(["16", "32", "64", "128", "256"]), default="32",
              show_default=True, help="Quantization block size (int8/int4).")
@click.option("--float-embeddings", is_flag=True,
              help="int8/int4: keep the embedding and LM head in float (default: int8).")
@click.option("--accuracy-level", type=click.IntRange(0, 4),
              help="int4: MatMulNBits accuracy level of the projections: 0 = fp32 activations "
                   "(default; faithful), 4 = int8 activations (faster). int8 always uses 4.")
@click.option("--quant-scheme", type=click.Choice(["zero_point", "offset", "symmetric"]),
              help="int8/int4 blocks: uint8 zero points (int8 default), float block minimums "
                   "(int4 default; exact for Q4_1 GGUF weights) or symmetric.")
@click.option("--all-logits", is_flag=True,
              help="The prefill graph returns logits for every position (default: last only).")
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="Execution provider the folder is built for. cuda: every node has a CUDA "
                   "kernel (int8/int4 compute in fp16; fp32 and ALiBi models are refused). "
                   "auto: cuda when a usable CUDA GPU is present.")
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs torch parity gate.")
@click.option("--force", is_flag=True, help="Replace --out if it exists (only once the new "
              "folder is complete).")
@_handle_errors
def export(config_name, checkpoint, random_weights, seed, precision, out, max_seq_len, block_size,
           float_embeddings, accuracy_level, quant_scheme, all_logits, target, no_validate,
           force) -> None:
    """Export a model to an ONNX model folder (prefill.onnx, decode.onnx, weights.data, tokenizer,
    manifest.json), then check it against torch in ONNX Runtime.

    \b
    Examples:
      llm-onnx export --checkpoint ./SmolLM2-135M-Instruct.Q4_1.gguf --precision fp32
      llm-onnx export --checkpoint ~/ckpt/Qwen3-30B-A3B --precision int4 --out models/q3moe
      llm-onnx export --config qwen3_8b --random-weights --precision fp16
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --target cuda
    """
    from llm_onnx.export import ExportOptions, export_model

    ckpt = resolve_checkpoint(config_name, checkpoint, random_weights, seed)
    precision = precision or _default_precision()
    options = ExportOptions(precision=precision, block_size=int(block_size),
                            embedding_bits=None if float_embeddings else 8,
                            accuracy_level=accuracy_level, quant_scheme=quant_scheme,
                            max_seq_len=max_seq_len,
                            all_logits=all_logits, validate=not no_validate,
                            target=None if target == "auto" else target)
    out = out or Path("models") / f"{ckpt.name}-{precision}"
    folder = export_model(ckpt, out, options, force=force, progress=True)
    click.echo(f"Exported {ckpt.name} ({precision}) to {folder}")


def resolve_checkpoint(config_name: str | None, checkpoint: Path | None, random_weights: bool,
                       seed: int = 0):  # -> Checkpoint
    """--checkpoint PATH | --config NAME --random-weights | --config NAME (local HF cache)."""
    from llm_onnx.checkpoints.hub_cache import find_cached_checkpoint, hub_cache_dirs
    from llm_onnx.checkpoints.load import open_checkpoint, random_checkpoint
    from llm_onnx.errors import ConfigError
    from llm_onnx.families import HF_REPOS, get_config

    if checkpoint is not None and config_name is not None:
        raise ConfigError("Give either --checkpoint PATH or --config NAME, not both.")
    if checkpoint is not None:
        if random_weights:
            raise ConfigError("--random-weights goes with --config NAME, not --checkpoint.")
        return open_checkpoint(checkpoint)
    if config_name is None:
        raise ConfigError("Say what to export: --checkpoint PATH (Hugging Face folder or .gguf) "
                          "or --config NAME.")
    cfg = get_config(config_name)
    if random_weights:
        return random_checkpoint(cfg, config_name, seed)
    repo = HF_REPOS.get(config_name)
    found = find_cached_checkpoint(repo) if repo else None
    if found is None:
        where = ", ".join(str(d) for d in hub_cache_dirs())
        raise ConfigError(
            f"No local weights for {config_name}"
            + (f" ({repo} is not in the Hugging Face cache: {where})" if repo else "")
            + ". Pass --checkpoint PATH, or --random-weights for random weights of its shape.")
    ckpt = open_checkpoint(found)
    ckpt.name = config_name
    return ckpt


def _sampling_options(func):
    """The generation options shared by `generate` and `chat`."""
    options = [
        click.option("--max-new-tokens", type=int, default=256, show_default=True,
                     help="Most tokens to generate."),
        click.option("--temperature", type=float,
                     help="0 = greedy (the default unless the model ships sampling defaults)."),
        click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, help="Nucleus sampling, in (0, 1]."),
        click.option("--min-p", type=float, help="Drop tokens below min_p x the top probability."),
        click.option("--repetition-penalty", type=float, help="> 1 discourages repeats (1 = off)."),
        click.option("--presence-penalty", type=float, help="Subtracted once from seen tokens' logits."),
        click.option("--frequency-penalty", type=float, help="Subtracted per occurrence."),
        click.option("--seed", type=int, help="Same seed, same output."),
        click.option("--stop", multiple=True, help="Stop string (repeatable); not printed."),
        click.option("--stop-token-id", "stop_token_ids", type=int, multiple=True,
                     help="Extra end-of-sequence token id (repeatable)."),
        click.option("--model", type=click.Path(path_type=Path),
                     help="Model folder from `llm-onnx export`. Default: SmolLM2-135M-Instruct "
                          "(exported on first use)."),
        click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                     show_default=True, help="Execution provider."),
        click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores)."),
        click.option("--quiet", "-q", is_flag=True, help="Do not print the model/provider line."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


class _TemplateVar(click.ParamType):
    """KEY=VALUE: VALUE is read as JSON when it parses (false, 3, "x", [1, 2]), else as text."""

    name = "KEY=VALUE"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        import json

        key, sep, raw = str(value).partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            self.fail(f"{value!r} is not KEY=VALUE with a template variable name as KEY "
                      "(e.g. enable_thinking=false).", param, ctx)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        return key, parsed


def _template_options(func):
    """Chat template variables, shared by `generate` and `chat`."""
    options = [
        click.option("--no-think", is_flag=True,
                     help="Reasoning models: answer without thinking (the template's "
                          "enable_thinking=false, as in Qwen3)."),
        click.option("--template-var", "template_var", type=_TemplateVar(), multiple=True,
                     help="A chat template variable, KEY=VALUE (repeatable); VALUE is JSON when "
                          "it parses, else text. E.g. --template-var enable_thinking=false."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _template_vars(model, no_think: bool, pairs) -> dict | None:
    """--no-think and --template-var as template variables, checked against the model's template:
    a name it never reads is an error, not a silent no-op."""
    from llm_onnx.errors import GenerationError
    from llm_onnx.runtime.chat import RESERVED_VARIABLES, check_template_vars, template_variables

    variables = dict(pairs)
    if no_think:
        if variables.get("enable_thinking", False) is not False:
            raise click.BadParameter("--no-think contradicts --template-var enable_thinking=...",
                                     param_hint="'--no-think'")
        variables["enable_thinking"] = False
    if not variables:
        return None
    if not model.chat_template:
        raise GenerationError("--no-think and --template-var set chat template variables, but "
                              "this model has no chat template.")
    try:
        check_template_vars(variables)
    except GenerationError as e:
        raise click.BadParameter(str(e), param_hint="'--template-var'") from None
    reads = template_variables(model.chat_template)
    unread = [name for name in variables if name not in reads]
    if no_think and "enable_thinking" in unread:
        raise GenerationError("--no-think: this model's chat template has no enable_thinking "
                              "switch (it does not think, or always does).")
    if unread:
        names = sorted(reads - RESERVED_VARIABLES - set(model.special_tokens))
        raise click.BadParameter(f"the model's chat template does not use {unread[0]!r} (it "
                                 f"reads: {', '.join(names) or 'no other variables'}).",
                                 param_hint="'--template-var'")
    return variables


def _echo_pieces(pieces) -> None:
    """Print a reply as it streams: the answer to stdout, a reasoning model's thinking dimmed to
    stderr (so a pipe gets the answer alone)."""
    thinking = False
    for piece in pieces:
        if getattr(piece, "reasoning", False):
            click.echo(click.style(piece, dim=True), nl=False, err=True)
            thinking = True
            continue
        if thinking:
            click.echo(err=True)
            thinking = False
        click.echo(piece, nl=False)
    if thinking:
        click.echo(err=True)
    click.echo()


_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids")


def _load_model(kwargs: dict):
    from llm_onnx.runtime import Model

    folder = kwargs.pop("model")
    if folder is None:
        from llm_onnx.default_model import default_model_folder

        folder = default_model_folder(progress=True, provider=kwargs["provider"])
    model = Model.load(folder, provider=kwargs.pop("provider"), threads=kwargs.pop("threads"))
    if not kwargs.pop("quiet"):
        click.echo(f"[{model.engine.describe()}]", err=True)
    overrides = {k: kwargs.pop(k) for k in _SAMPLING_KEYS}
    overrides = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in overrides.items()
                 if v is not None and v != ()}
    model.options(None, overrides)  # bad options fail here, before any work
    return model, overrides


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    from llm_onnx.errors import GenerationError

    if prompt is not None and prompt_file is not None:
        raise GenerationError("Give the prompt as an argument or with --prompt-file, not both.")
    if prompt_file is not None:
        data = click.open_file(str(prompt_file), "rb").read() if str(prompt_file) == "-" else \
            Path(prompt_file).read_bytes()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GenerationError(f"{prompt_file}: not valid UTF-8 (byte {e.start}: "
                                  f"{data[e.start:e.start + 1]!r}); save it as UTF-8.") from None
    if prompt is None or not prompt.strip():
        raise GenerationError("The prompt is empty: give a prompt, e.g. llm-onnx generate \"Hello\".")
    return prompt


@main.command()
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
              help="Read the prompt from a UTF-8 file ('-' for stdin).")
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--system", help="System message (chat template only).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, token_ids, finish_reason, timings (and "
                   "reasoning, for a reasoning model).")
@_template_options
@_sampling_options
@_handle_errors
def generate(prompt, prompt_file, raw, system, as_json, no_think, template_var, **kwargs) -> None:
    """Generate an answer to PROMPT and stream it to stdout (a reasoning model's thinking goes
    to stderr).

    \b
    Examples:
      llm-onnx generate "What is the capital of France?"
      llm-onnx generate --raw "Once upon a time" --temperature 0.8 --seed 1
      llm-onnx generate --model models/qwen3-8b-int4 --json "Hi" | jq .timings
      llm-onnx generate --model models/qwen3-8b-int4 --no-think "Hi"
    """
    import json as _json

    from llm_onnx.errors import GenerationError

    text = _read_prompt(prompt, prompt_file)
    model, overrides = _load_model(kwargs)
    if raw and (no_think or template_var):
        raise GenerationError("--no-think and --template-var apply to the chat template, which "
                              "--raw does not use.")
    template_vars = _template_vars(model, no_think, template_var)
    if not raw and model.chat_template:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        if as_json:
            result = model.chat(messages, template_vars=template_vars, **overrides)
        else:
            pieces = model.stream_chat(messages, template_vars=template_vars, **overrides)
    elif as_json:
        result = model.generate(text, **overrides)
    else:
        pieces = model.stream(text, **overrides)
    if as_json:
        click.echo(_json.dumps(result.to_dict(), ensure_ascii=False))
        return
    _echo_pieces(pieces)


@main.command()
@click.option("--system", help="System message.")
@_template_options
@_sampling_options
@_handle_errors
def chat(system, no_think, template_var, **kwargs) -> None:
    """Chat with a model; earlier turns stay in the KV cache. A reasoning model's thinking goes
    to stderr, dimmed.

    Type a message and press Enter. /reset starts over, /exit or Ctrl-D leaves.

    \b
    Examples:
      llm-onnx chat
      llm-onnx chat --model models/qwen3-8b-int4 --temperature 0.7 --seed 1
      llm-onnx chat --model models/qwen3-8b-int4 --no-think
    """
    from llm_onnx.errors import GenerationError

    model, overrides = _load_model(kwargs)
    if not model.chat_template:
        raise GenerationError("this model has no chat template; use `llm-onnx generate --raw`.")
    session = model.chat_session(system, template_vars=_template_vars(model, no_think,
                                                                      template_var))
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            if interactive:
                click.echo()
            return
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return
        if line == "/reset":
            session.reset()
            click.echo("(conversation cleared)", err=True)
            continue
        _echo_pieces(session.stream(line, **overrides))


@main.command()
@click.option("--model", type=click.Path(path_type=Path),
              help="Model folder from `llm-onnx export`. Default: SmolLM2-135M-Instruct "
                   "(exported on first use).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; then set --api-key).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests decoding together (rows of the KV cache).")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests waiting for a row; beyond it the server answers 429 at once.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=256, show_default=True,
              help="Most prompt tokens run per step while other requests are decoding.")
@click.option("--max-seq-len", type=click.IntRange(min=2),
              help="Positions per request, prompt and answer (default: the model's context).")
@click.option("--api-key", envvar="LLM_ONNX_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every endpoint but /health.")
@click.option("--model-name", help="The model id clients send (default: the folder's name).")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Execution provider.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="On SIGTERM / Ctrl-C, seconds running requests get to finish.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Allow browser pages from this origin (repeatable; '*' for any).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--ray", "use_ray", is_flag=True,
              help="Serve on Ray Serve: replicas of the model behind Ray's HTTP proxy "
                   "(pip install 'llm-onnx[ray]').")
@click.option("--replicas", type=click.IntRange(min=1),
              help="With --ray: this many replicas (default 1), each with --threads CPUs.")
@click.option("--autoscale", metavar="MIN:MAX",
              help="With --ray: scale between MIN and MAX replicas on load.")
@click.option("--address", metavar="auto|ray://HOST:PORT",
              help="With --ray: join this Ray cluster (default: start a local Ray instance).")
@_handle_errors
def serve(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len, api_key,
          model_name, provider, threads, drain_timeout, cors_origins, log_level, use_ray,
          replicas, autoscale, address) -> None:
    """Serve a model over an OpenAI-compatible HTTP API, batching concurrent requests.

    Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true),
    GET /v1/models, GET /health, GET /metrics (Prometheus).

    \b
    Examples:
      llm-onnx serve --model models/smollm2-int8
      llm-onnx serve --model models/qwen3-8b-int4 --port 8080 --max-batch 16
      LLM_ONNX_API_KEY=secret llm-onnx serve --host 0.0.0.0 --model models/smollm2-int8
      curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-int8", "messages": [{"role": "user", "content": "Hi"}]}'
      llm-onnx serve --ray --replicas 2 --threads 1 --model models/smollm2-int8
      llm-onnx serve --ray --address auto --autoscale 1:4 --model /shared/smollm2-int8
    """
    if use_ray:
        return _serve_ray(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len,
                          api_key, model_name, provider, threads, replicas, autoscale, address,
                          cors_origins)
    if replicas or autoscale or address:
        raise click.UsageError("--replicas, --autoscale and --address need --ray.")
    try:
        from llm_onnx.serve import server
        from llm_onnx.serve.app import Service
    except ImportError as e:
        raise click.ClickException(f"llm-onnx serve needs the serve extra ({e.name} is missing): "
                                   "pip install 'llm-onnx[serve]'.") from None
    from llm_onnx.runtime import Model

    server.check_address(host, port)
    if model is None:
        from llm_onnx.default_model import default_model_folder

        model = default_model_folder(progress=True, provider=provider)
    loaded = Model.load(model, provider=provider, threads=threads)
    service = Service(loaded, name=model_name, api_key=api_key, max_batch=max_batch,
                      max_queue=max_queue, prefill_chunk=prefill_chunk, max_length=max_seq_len)
    auth = "API key required" if service.api_key else "no API key"
    click.echo(f"Serving {service.name} ({loaded.engine.describe()}) at http://{host}:{port}/v1 "
               f"- max batch {max_batch}, {auth}. Ctrl-C to stop.", err=True)
    server.run(service, host=host, port=port, drain_timeout=drain_timeout, log_level=log_level,
               cors_origins=cors_origins)


def _serve_ray(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len, api_key,
               model_name, provider, threads, replicas, autoscale, address, cors_origins) -> None:
    try:
        from llm_onnx.serve import ray_app
    except ImportError as e:
        raise click.ClickException(f"llm-onnx serve --ray needs the ray extra ({e.name} is "
                                   "missing): pip install 'llm-onnx[ray]'.") from None
    from llm_onnx.model_folder import load_manifest

    if replicas and autoscale:
        raise click.UsageError("give --replicas or --autoscale, not both.")
    if cors_origins:
        raise click.UsageError("--cors-origin is not available with --ray.")
    if address is None:
        from llm_onnx.serve import server

        server.check_address(host, port)
    if model is None:
        from llm_onnx.default_model import default_model_folder

        model = default_model_folder(progress=True)
    folder = Path(model).resolve()  # replicas start in other working folders (or machines)
    load_manifest(folder, verify=False)  # a bad folder fails here, not in every replica
    config = ray_app.ReplicaConfig(model=str(folder), name=model_name or folder.name,
                                   api_key=api_key, max_batch=max_batch, max_queue=max_queue,
                                   prefill_chunk=prefill_chunk, max_seq_len=max_seq_len,
                                   threads=threads or 1, provider=provider)
    scaling = ray_app.Scaling(replicas=replicas or 1,
                              autoscale=ray_app.parse_autoscale(autoscale) if autoscale else None)
    where = "a local Ray instance" if address is None else f"the Ray cluster at {address}"
    count = f"{scaling.autoscale[0]}-{scaling.autoscale[1]} replicas" if scaling.autoscale \
        else f"{scaling.replicas} replica{'s' if scaling.replicas > 1 else ''}"

    def ready() -> None:
        click.echo(f"Serving {config.name} on {where}: {count} of {threads or 1} thread(s) each, "
                   f"at http://{host}:{port}/v1. Ctrl-C to stop.", err=True)

    ray_app.run(config, scaling, host=host, port=port, address=address, on_ready=ready)


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
@_handle_errors
def bench(model, prompt_len, new_tokens, batch, repeat, threads, provider, prompt_ids, as_json,
          plot, profile) -> None:
    """Measure time to first token, prefill and decode speed, peak memory, and the decode speed
    the machine's memory bandwidth allows.

    \b
    Examples:
      llm-onnx bench
      llm-onnx bench --model models/qwen3-8b-int4 --prompt-len 512 --new-tokens 64 --json
      llm-onnx bench --model models/smollm2-int8 --plot decode.png
      llm-onnx bench --model models/smollm2-int8 --profile
    """
    import json as _json

    from llm_onnx.errors import GenerationError
    from llm_onnx.runtime import Model
    from llm_onnx.bench import (CURVE_BATCHES, BenchConfig, add_profile, curve_contexts,
                                        decode_curve, peak_rss_mib, plot_curve, profile_model,
                                        profile_table, pyplot, run_bench, to_json)

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
    loaded = Model.load(model, provider=provider, threads=threads)
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


if __name__ == "__main__":
    main()
