"""`llm-onnx generate`, and the sampling and chat-template options it shares with `chat`
(chatting.py)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main


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
        click.option("--stop", multiple=True, callback=lambda ctx, param, value: tuple(
                         unescape(v) for v in value),
                     help="Stop string (repeatable); not printed. Backslash escapes are "
                          "understood: --stop '\\n\\n' stops at a blank line (\\\\ for a "
                          "backslash)."),
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
    return speculative_options(func)


def speculative_options(func):
    """--speculative, --draft-model, --num-speculative-tokens (generate, chat, bench, serve)."""
    options = [
        click.option("--speculative", type=click.Choice(["off", "ngram", "draft"]),
                     help="Speculative decoding: several tokens per model run, the same output. "
                          "ngram: drafts from the prompt and answer so far (prompt lookup; "
                          "pays off when the answer repeats the prompt: edits, code, quotes); "
                          "draft: --draft-model drafts. Default: ngram for fp32 folders, else "
                          "off."),
        click.option("--draft-model", type=click.Path(path_type=Path, file_okay=False),
                     help="A model folder with the same tokenizer that drafts tokens (e.g. an "
                          "int4 export of the same model); implies --speculative draft."),
        click.option("--num-speculative-tokens", type=click.IntRange(1, 32),
                     help="Most tokens drafted per step (default 6; fewer while drafts fail)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def pop_speculative(kwargs: dict) -> dict:
    """Model.load's speculation keywords from the CLI's options."""
    return {"speculative": kwargs.pop("speculative"), "draft_model": kwargs.pop("draft_model"),
            "num_speculative_tokens": kwargs.pop("num_speculative_tokens")}


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


def _constraint_options(func):
    """What the answer must match, and the chat template; shared by `generate` and `chat`."""
    options = [
        click.option("--json-schema", metavar="FILE|JSON",
                     help="The answer is JSON valid under this JSON Schema (a file, or the "
                          "schema itself)."),
        click.option("--json-object", is_flag=True,
                     help="The answer is one JSON object (any keys and values)."),
        click.option("--regex", metavar="PATTERN",
                     help="The answer matches this regular expression as a whole."),
        click.option("--grammar", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                     help="The answer follows this grammar file: Lark (llguidance's variant) "
                          "or llama.cpp's GBNF."),
        click.option("--choice", multiple=True,
                     help="The answer is exactly one of these strings (repeatable)."),
        click.option("--chat-template", metavar="FILE|NAME",
                     help="A Jinja chat template file (or a tokenizer_config.json), or one that "
                          "comes with llm-onnx (chatml-tools), used instead of the folder's."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _constraint(kwargs: dict) -> dict:
    """--json-schema / --json-object / --regex / --grammar / --choice as the ``constraint``
    generation option (at most one; errors name the flag)."""
    import json

    from llm_onnx.errors import GenerationError
    from llm_onnx.runtime.structured.constraint import Constraint

    given = []
    schema = kwargs.pop("json_schema")
    if schema is not None:
        path = Path(schema)
        inline = schema.lstrip().startswith("{")
        if not inline and not path.is_file():
            raise GenerationError(f"--json-schema {schema}: no such file, and not a JSON "
                                  "schema either (give a file or the schema's JSON).")
        text = schema if inline else path.read_text(encoding="utf-8")
        try:
            parsed = json.loads(text)
        except ValueError as e:
            where = "--json-schema" if inline else f"--json-schema {path}"
            raise GenerationError(f"{where}: not valid JSON ({e}).") from None
        given.append(("--json-schema", Constraint.json_schema(parsed, where="--json-schema")))
    if kwargs.pop("json_object"):
        given.append(("--json-object", Constraint.json_object(where="--json-object")))
    regex = kwargs.pop("regex")
    if regex is not None:
        given.append(("--regex", Constraint.regex(regex, where="--regex")))
    grammar = kwargs.pop("grammar")
    if grammar is not None:
        text = Path(grammar).read_text(encoding="utf-8")
        given.append(("--grammar", Constraint.grammar(text, where=f"--grammar {grammar}")))
    choice = kwargs.pop("choice")
    if choice:
        given.append(("--choice", Constraint.choice(list(choice), where="--choice")))
    if len(given) > 1:
        raise GenerationError(f"give one of {', '.join(flag for flag, _ in given)}, not "
                              "several.")
    return {"constraint": given[0][1]} if given else {}


def _template_vars(model, no_think: bool, pairs) -> dict | None:
    """--no-think and --template-var as template variables, checked against the model's template:
    a name it never reads is an error, not a silent no-op."""
    from llm_onnx.errors import GenerationError
    from llm_onnx.runtime.chat.render import (
        RESERVED_VARIABLES,
        check_template_vars,
        template_variables,
    )

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


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def unescape(text: str) -> str:
    """A stop string as typed in a shell: ``\\n``, ``\\t``, ``\\r``, ``\\0``, ``\\\\``, quotes and
    ``\\uXXXX`` become what they stand for; any other backslash stays as it is."""
    def one(m: re.Match) -> str:
        code = m.group(1)
        if code.startswith("u"):
            return chr(int(code[1:], 16))
        return _ESCAPES[code]

    return re.sub(r"\\(u[0-9a-fA-F]{4}|[ntr0\\\"'])", one, text)


def cut_mark(result, limit: int) -> str | None:
    """The line that says an answer was cut by the token limit (None when it was not)."""
    if result is None or result.finish_reason != "length":
        return None
    return click.style(f"[cut at {len(result.token_ids)} tokens: --max-new-tokens {limit}]",
                       dim=True)


def loop_mark(result, model) -> str | None:
    """The line that says an answer ran to the token limit repeating one phrase (a repetition
    loop: llm_onnx.runtime.generation.loops), and what to try instead; None when it did not."""
    from llm_onnx.runtime.generation.loops import find_loop

    if result is None or result.finish_reason != "length":
        return None
    loop = find_loop(result.token_ids)
    if loop is None:
        return None
    phrase = f"a {loop.period}-token phrase"
    if model.tokenizer is not None:
        text = model.tokenizer.decode(result.token_ids[loop.start:loop.start + loop.period])
        if text.strip():
            phrase = repr(text if len(text) <= 40 else text[:37] + "...")
    return click.style(f"[looped: {phrase} over and over, {loop.span} of {len(result.token_ids)} "
                       f"tokens, to the limit; try {_loop_remedies(model)}]", dim=True)


def _loop_remedies(model) -> str:
    """What breaks a loop, best first (docs/generate.md#when-an-answer-loops: a repetition
    penalty of 1.1 ended SmolLM2-135M's loop on the README's question at int8 and int4)."""
    tries = ["--repetition-penalty 1.1", "sampling (--temperature 0.8)"]
    manifest = getattr(model.engine, "manifest", None)
    precision = manifest.precision.precision if manifest is not None else None
    if precision in ("int8", "int4"):  # a near-tie it flipped may be where the loop began
        tries.append("an fp32 export")
    return ", ".join(tries[:-1]) + " or " + tries[-1]


def echo_pieces(pieces):
    """Print a reply as it streams: the answer to stdout, a reasoning model's thinking dimmed to
    stderr (so a pipe gets the answer alone). Returns the stream's return value: the finished
    Result of Model.stream and Model.stream_chat."""
    thinking = False
    pieces = iter(pieces)
    while True:
        try:
            piece = next(pieces)
        except StopIteration as end:
            result = end.value
            break
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
    return result


_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids")


def _load_model(kwargs: dict):
    from llm_onnx.runtime import Model

    folder = kwargs.pop("model")
    constraint = _constraint(kwargs)
    if folder is None:
        from llm_onnx.default_model import default_model_folder

        folder = default_model_folder(progress=True, provider=kwargs["provider"])
    model = Model.load(folder, provider=kwargs.pop("provider"), threads=kwargs.pop("threads"),
                       chat_template=kwargs.pop("chat_template"), **pop_speculative(kwargs))
    model.require_generation()  # an embedding model's folder: `llm-onnx embed`
    if not kwargs.pop("quiet"):
        click.echo(f"[{model.engine.describe()}]", err=True)
    overrides = {k: kwargs.pop(k) for k in _SAMPLING_KEYS}
    overrides = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in overrides.items()
                 if v is not None and v != ()}
    overrides.update(constraint)
    options = model.options(None, dict(overrides))  # bad options fail here, before any work
    if options.constraint is not None:  # and a bad schema, regex or grammar
        model.constraints.compile(options.constraint)
    return model, overrides


def parse_ids(value: str) -> list[int]:
    """--prompt-ids: '1,2,3', '1 2 3' or a file holding a JSON list of integers."""
    import json

    from llm_onnx.errors import GenerationError

    path = Path(value)
    if path.is_file():
        try:
            ids = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise GenerationError(f"--prompt-ids {path}: not a JSON list of token ids ({e}).") \
                from None
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise GenerationError(f"--prompt-ids {path}: expected a JSON list of integers.")
    else:
        try:
            ids = [int(part) for part in re.split(r"[,\s]+", value.strip()) if part]
        except ValueError:
            raise GenerationError(f"--prompt-ids {value!r}: give token ids as '1,2,3' (or a "
                                  "file holding a JSON list of them).") from None
    if not ids:
        raise GenerationError("--prompt-ids: no token ids given.")
    return ids


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
@click.option("--prompt-ids", metavar="IDS|FILE",
              help="The prompt as token ids instead of text: '1,2,3' (or spaces), or a file "
                   "holding a JSON list; the answer is printed as token ids too when the folder "
                   "has no tokenizer (a --random-weights export). Implies --raw.")
@click.option("--raw", is_flag=True, help="Do not apply the chat template.")
@click.option("--image", "images", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An image for the prompt (repeatable; a folder that takes images: "
                   "docs/images.md). With the chat template the images come before the text.")
@click.option("--system", help="System message (chat template only).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, token_ids, finish_reason, timings (and "
                   "reasoning, for a reasoning model).")
@_template_options
@_constraint_options
@_sampling_options
@_handle_errors
def generate(prompt, prompt_file, prompt_ids, raw, images, system, as_json, no_think,
             template_var, **kwargs) -> None:
    """Generate an answer to PROMPT and stream it to stdout (a reasoning model's thinking goes
    to stderr). --json-schema, --json-object, --regex, --grammar and --choice constrain the
    answer (after a reasoning model's thinking).

    \b
    Examples:
      llm-onnx generate "What is the capital of France?"
      llm-onnx generate --raw "Once upon a time" --temperature 0.8 --seed 1
      llm-onnx generate --model models/qwen3-8b-int4 --json "Hi" | jq .timings
      llm-onnx generate --model models/qwen3-8b-int4 --no-think "Hi"
      llm-onnx generate --json-schema person.schema.json "A person living in Paris, as JSON"
      llm-onnx generate --choice positive --choice negative "Sentiment of: I loved it"
      llm-onnx generate --regex '[0-9]{4}-[0-9]{2}-[0-9]{2}' "Today's date?"
      llm-onnx generate --speculative ngram --prompt-file edit-this-paragraph.txt
      llm-onnx generate --model models/qwen3-8b-fp32 --draft-model models/qwen3-8b-int4 "Hi"
      llm-onnx generate --model models/qwen3_8b-int8 --prompt-ids 9707,11,1879 --max-new-tokens 8
      llm-onnx generate --model models/qwen3-vl-2b-int8 --image photo.jpg "What is in it?"
    """
    import json as _json

    from llm_onnx.errors import GenerationError

    if prompt_ids is not None:
        if prompt is not None or prompt_file is not None:
            raise GenerationError("Give the prompt as text or with --prompt-ids, not both.")
        ids = parse_ids(prompt_ids)
        model, overrides = _load_model(kwargs)
        result = model.generate(ids, images=[str(i) for i in images] or None, **overrides)
        if as_json:
            click.echo(_json.dumps(result.to_dict(), ensure_ascii=False))
        elif model.tokenizer is None:
            click.echo(" ".join(map(str, result.token_ids)))
        else:
            click.echo(result.text)
        _echo_loop_mark(result, model)
        return
    text = _read_prompt(prompt, prompt_file)
    model, overrides = _load_model(kwargs)
    if raw and (no_think or template_var):
        raise GenerationError("--no-think and --template-var apply to the chat template, which "
                              "--raw does not use.")
    template_vars = _template_vars(model, no_think, template_var)
    if not raw and model.chat_template:
        content = [{"type": "image", "image": str(i)} for i in images] + [
            {"type": "text", "text": text}] if images else text
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": content}]
        if as_json:
            result = model.chat(messages, template_vars=template_vars, **overrides)
        else:
            pieces = model.stream_chat(messages, template_vars=template_vars, **overrides)
    elif as_json or images:  # (a raw prompt with images: the answer when it is complete)
        result = model.generate(text, images=[str(i) for i in images] or None, **overrides)
        if not as_json:
            click.echo(result.text)
            return
    else:
        pieces = model.stream(text, **overrides)
    if as_json:
        click.echo(_json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        result = echo_pieces(pieces)
    _echo_loop_mark(result, model)


def _echo_loop_mark(result, model) -> None:
    mark = loop_mark(result, model)
    if mark:
        click.echo(mark, err=True)
