"""`llm-onnx serve`: the OpenAI-compatible server, in process or on Ray Serve."""

from __future__ import annotations

from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main
from llm_onnx.cli.generating import speculative_options


def _tool_dialect(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--tool-call-format: the name of a tool dialect (llm_onnx.runtime.chat.dialects), checked
    against the registry (imported only when the option is given)."""
    if value is None:
        return None
    import difflib

    from llm_onnx.runtime.chat.dialects import choosable_tool_dialects

    names = choosable_tool_dialects()
    if value not in names:
        close = difflib.get_close_matches(value, names, n=1)
        raise click.BadParameter(f"{value!r} is not one of {', '.join(names)}."
                                 + (f" Did you mean {close[0]!r}?" if close else ""))
    return value


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
@click.option("--max-cache-memory", type=click.FloatRange(min=0, min_open=True), metavar="GIB",
              help="Most memory the running requests' cache rows may take, counted at their "
                   "longest (prompt + max_tokens of keys and values; a hybrid model's "
                   "recurrent state and its checkpoints): requests beyond it wait for a row to "
                   "free (default: no bound but --max-batch).")
@click.option("--stored-responses", type=click.IntRange(min=0), default=1000, show_default=True,
              help="The Responses API's store (store: true, previous_response_id, GET "
                   "/v1/responses/ID): at most this many responses, the oldest dropped first.")
@click.option("--stored-responses-memory", type=click.FloatRange(min=0), default=64.0,
              show_default=True, metavar="MIB",
              help="... and at most this many MiB of them.")
@click.option("--api-key", envvar="LLM_ONNX_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every endpoint but /health.")
@click.option("--model-name", "model_names", multiple=True, metavar="NAME[,NAME...]",
              help="The model id clients send (default: the folder's name); repeatable or a "
                   "comma-separated list: the first is the id /v1/models lists and answers "
                   "carry, the others aliases. The folder's and the checkpoint's names are "
                   "accepted too, in any case.")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Execution provider.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="On SIGTERM / Ctrl-C, seconds running requests get to finish.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Allow browser pages from this origin (repeatable; '*' for any).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--chat-template", metavar="FILE|NAME",
              help="A Jinja chat template file (or a tokenizer_config.json), or one that comes "
                   "with llm-onnx (chatml-tools: ChatML with tools), used instead of the "
                   "folder's; the folder is not modified.")
@click.option("--tool-call-format", metavar="NAME", callback=_tool_dialect,
              help="How the model writes tool calls: a tool dialect's name, such as hermes, "
                   "mistral or gemma4 (default: read off the chat template; a wrong name lists "
                   "them).")
@click.option("--allowed-media-domains", "media_domains", multiple=True, metavar="HOST",
              help="Fetch image URLs from HOST and its subdomains (repeatable; by default none: "
                   "images come as data: URLs). Each fetch is bounded: 20 MiB, 10 s, no "
                   "redirects.")
@click.option("--strict-fields", is_flag=True,
              help="Refuse (400) every request field the server would accept and ignore, but "
                   "its API's hints and metadata (user, metadata, cache keys): unknown fields, "
                   "server-side conveniences such as context_management, tools it cannot run. "
                   "By default they are accepted and named in the llm-onnx-ignored header.")
@click.option("--web-ui/--no-web-ui", default=True, show_default=True,
              help="The chat page at / (a conversation with the model in the browser).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Serve on Ray Serve: replicas of the model behind Ray's HTTP proxy "
                   "(the ray extra: pip install '.[ray]' in the checkout).")
@click.option("--replicas", type=click.IntRange(min=1),
              help="With --ray: this many replicas (default 1), each with --threads CPUs.")
@click.option("--autoscale", metavar="MIN:MAX",
              help="With --ray: scale between MIN and MAX replicas on load.")
@click.option("--address", metavar="auto|ray://HOST:PORT",
              help="With --ray: join this Ray cluster (default: start a local Ray instance).")
@speculative_options
@_handle_errors
def serve(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len, max_cache_memory,
          stored_responses, stored_responses_memory, api_key,
          model_names, provider, threads, drain_timeout, cors_origins, log_level, chat_template,
          tool_call_format, media_domains, strict_fields, web_ui, use_ray, replicas, autoscale,
          address, **speculation) -> None:
    """Serve a model over an OpenAI-compatible HTTP API, batching concurrent requests.

    Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (OpenAI's
    Responses API; GET and DELETE /v1/responses/ID for stored ones) (all with "stream": true),
    GET /v1/models, GET /health, GET /metrics (Prometheus); a chat page at / (--no-web-ui:
    none). Structured output: response_format
    (json_object, json_schema), vLLM's structured_outputs (json, regex, choice, grammar), tools
    with tool_choice auto / required / a named function. Speculative decoding (prompt lookup
    by default on fp32 folders) runs while at most two requests decode; /metrics counts drafted
    and accepted tokens. A folder from `llm-onnx export --task embed` is served at POST
    /v1/embeddings instead (OpenAI's embeddings API; no chat page).

    \b
    Examples:
      llm-onnx export --checkpoint default --precision int8 --out models/smollm2-int8
      llm-onnx serve --model models/smollm2-int8     # model id "smollm2-int8"
      llm-onnx serve --model models/smollm2-int8 --model-name smollm2,gpt-4o-mini
      llm-onnx serve --model models/qwen3-8b-int4 --port 8080 --max-batch 16
      llm-onnx serve --chat-template chatml-tools     # SmolLM2 with tools
      LLM_ONNX_API_KEY=secret llm-onnx serve --host 0.0.0.0 --model models/smollm2-int8
      curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-int8", "messages": [{"role": "user", "content": "Hi"}]}'
      llm-onnx serve --ray --replicas 2 --threads 1 --model models/smollm2-int8
      llm-onnx serve --ray --address auto --autoscale 1:4 --model /shared/smollm2-int8
      llm-onnx serve --model models/qwen3-8b-fp16 --draft-model models/qwen3-8b-int4
      llm-onnx serve --model models/q3e     # an embedding model: POST /v1/embeddings
      curl http://127.0.0.1:8000/v1/embeddings -H 'Content-Type: application/json' \\
        -d '{"model": "q3e", "input": ["a text", "another"]}'
    """
    if use_ray:
        return _serve_ray(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len,
                          max_cache_memory, api_key, ",".join(model_names), provider,
                          threads, replicas,
                          autoscale, address, cors_origins, chat_template, tool_call_format,
                          web_ui, speculation, stored_responses,
                          int(stored_responses_memory * 2**20), strict_fields)
    if replicas or autoscale or address:
        raise click.UsageError("--replicas, --autoscale and --address need --ray.")
    try:
        from llm_onnx.serve import server
        from llm_onnx.serve.media import MediaPolicy
        from llm_onnx.serve.service import Service
    except ImportError as e:
        raise click.ClickException(f"llm-onnx serve needs the serve extra ({e.name} is missing): "
                                   "pip install '.[serve]' in the checkout.") from None
    from llm_onnx.runtime import Model

    server.check_address(host, port)
    if model is None:
        from llm_onnx.default_model import default_model_folder

        model = default_model_folder(progress=True, provider=provider)
    loaded = Model.load(model, provider=provider, threads=threads, chat_template=chat_template,
                        tool_call_format=tool_call_format, **speculation)
    service = Service(loaded, name=model_names, api_key=api_key, max_batch=max_batch,
                      max_queue=max_queue, prefill_chunk=prefill_chunk, max_length=max_seq_len,
                      max_cache_bytes=int(max_cache_memory * 2**30) if max_cache_memory else None,
                      stored_responses=stored_responses,
                      stored_bytes=int(stored_responses_memory * 2**20),
                      strict_fields=strict_fields,
                      media=MediaPolicy(tuple(d.lower().strip(".") for d in media_domains)))
    auth = "API key required" if service.api_key else "no API key"
    if service.scheduler is None:  # an embedding model: POST /v1/embeddings, no chat page
        click.echo(f"Serving embeddings of {service.name} ({loaded.engine.describe()}, "
                   f"{loaded.engine.dimensions} dimensions, context {loaded.context_length}) at "
                   f"http://{host}:{port}/v1/embeddings - {auth}. Ctrl-C to stop.", err=True)
        web_ui = False
    else:
        tools = f"tool calls: {loaded.tool_format}" if loaded.tool_format else "no tool calls"
        click.echo(f"Serving {service.name} ({loaded.engine.describe()}) at "
                   f"http://{host}:{port}/v1 - max batch {max_batch}, {auth}, {tools}. Ctrl-C to "
                   "stop.", err=True)
        click.echo(f"Cache: {cache_line(loaded.engine, service.scheduler)}", err=True)
    click.echo(names_line(service.names), err=True)
    if web_ui:
        click.echo(f"Chat page: {_page_url(host, port)}", err=True)
    server.run(service, host=host, port=port, drain_timeout=drain_timeout, log_level=log_level,
               cors_origins=cors_origins, web_ui=web_ui)


def names_line(names) -> str:
    """The model ids clients may send (a ModelNames)."""
    also = f" (also {', '.join(names.aliases)}; any case)" if names.aliases else " (any case)"
    return f"Model name: {names.primary}{also}"


def cache_line(engine, scheduler) -> str:
    """What the cache's rows take: per position, per row whatever its length, at the longest."""
    per_pos, state = engine.kv_bytes_per_position, engine.state_bytes_per_row
    longest = engine.row_bytes(scheduler.max_length)
    parts = [f"{per_pos / 1024:.1f} KiB of keys and values a position"]
    if state:
        parts.append(f"{state / 2**20:.1f} MiB of recurrent state a row (with its "
                     f"{engine.options.state_checkpoints} checkpoints)")
    line = (f"{', '.join(parts)}; {longest / 2**20:.0f} MiB a row at {scheduler.max_length} "
            f"positions, {scheduler.max_batch * longest / 2**30:.2f} GiB for {scheduler.max_batch}"
            " rows")
    if scheduler.max_cache_bytes:
        line += f", bounded at {scheduler.max_cache_bytes / 2**30:.2f} GiB (--max-cache-memory)"
    return line + "."


def _page_url(host: str, port: int) -> str:
    """The chat page's address to open (an any-interface host is reachable on loopback)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else \
        f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _serve_ray(model, host, port, max_batch, max_queue, prefill_chunk, max_seq_len,
               max_cache_memory, api_key,
               model_name, provider, threads, replicas, autoscale, address, cors_origins,
               chat_template, tool_call_format, web_ui, speculation, stored_responses,
               stored_bytes, strict_fields) -> None:
    try:
        from llm_onnx.serve import ray_app
    except ImportError as e:
        raise click.ClickException(f"llm-onnx serve --ray needs the ray extra ({e.name} is "
                                   "missing): pip install '.[ray]' in the checkout.") from None
    from llm_onnx.model_folder import load_manifest
    from llm_onnx.serve.names import ModelNames

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
    manifest = load_manifest(folder, verify=False)  # a bad folder fails here, not in every replica
    if manifest.task == "embed":
        raise click.UsageError(f"{folder} is an embedding model: serve it without --ray (Ray "
                               "Serve replicas serve generation models).")
    template = None
    if chat_template is not None:  # read and checked here; its text travels to the replicas
        from llm_onnx.runtime.chat.request import read_chat_template

        template = read_chat_template(chat_template, manifest.tokenizer.special_tokens)
    names = ModelNames.of(model_name, folder.name, manifest.name)
    config = ray_app.ReplicaConfig(model=str(folder), name=",".join(names.all),
                                   api_key=api_key, max_batch=max_batch, max_queue=max_queue,
                                   prefill_chunk=prefill_chunk, max_seq_len=max_seq_len,
                                   max_cache_bytes=int(max_cache_memory * 2**30)
                                   if max_cache_memory else None, threads=threads or 1,
                                   provider=provider,
                                   chat_template=template, tool_call_format=tool_call_format,
                                   speculative=speculation["speculative"],
                                   draft_model=str(Path(speculation["draft_model"]).resolve())
                                   if speculation["draft_model"] else None,
                                   num_speculative_tokens=speculation["num_speculative_tokens"],
                                   web_ui=web_ui, stored_responses=stored_responses,
                                   stored_bytes=stored_bytes, strict_fields=strict_fields)
    scaling = ray_app.Scaling(replicas=replicas or 1,
                              autoscale=ray_app.parse_autoscale(autoscale) if autoscale else None)
    where = "a local Ray instance" if address is None else f"the Ray cluster at {address}"
    count = f"{scaling.autoscale[0]}-{scaling.autoscale[1]} replicas" if scaling.autoscale \
        else f"{scaling.replicas} replica{'s' if scaling.replicas > 1 else ''}"

    def ready() -> None:
        click.echo(f"Serving {names.primary} on {where}: {count} of {threads or 1} thread(s) "
                   f"each, at http://{host}:{port}/v1. Ctrl-C to stop.", err=True)
        click.echo(names_line(names), err=True)
        if web_ui:
            click.echo(f"Chat page: {_page_url(host, port)}", err=True)

    ray_app.run(config, scaling, host=host, port=port, address=address, on_ready=ready)
