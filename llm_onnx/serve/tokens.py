"""Text to token ids and back with the served model's tokenizer, as vLLM's and llama.cpp's
servers answer it (clients of either work unchanged; lm-eval's remote tokenizer uses them).

    POST /tokenize        vLLM: {"prompt": "text", "add_special_tokens": true,
                                 "return_token_strs": false}
                          or {"messages": [...], "add_generation_prompt": true,
                              "continue_final_message": false, "add_special_tokens": false,
                              "tools": [...], "chat_template_kwargs": {...}}
                          (continue_final_message: the final message's text is left open
                          for a reply to continue; no generation prompt then)
                          -> {"count": N, "max_model_len": M, "tokens": [ids],
                              "token_strs": [str] | null}
                          llama.cpp: {"content": "text", "add_special": false,
                                      "with_pieces": false}
                          -> {"tokens": [ids]} (with_pieces: [{"id", "piece"}])
    POST /detokenize      {"tokens": [ids]} -> {"prompt": "text", "content": "text"}
                          (vLLM's key and llama.cpp's)
    GET  /tokenizer_info  the tokenizer's special tokens, chat template and length (vLLM's)

``model`` may be given (it must be the served one). Errors are OpenAI-shaped 400s naming the
field.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from llm_onnx.errors import GenerationError
from llm_onnx.serve import openai_chat, pipeline, structured
from llm_onnx.serve.errors import bad
from llm_onnx.serve.fields import body_object, boolean, served_model
from llm_onnx.serve.policy import Fields

PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")
API = "tokenize"  # in the field policy's reports (policy.py); every field below is honoured
PROMPT_FIELDS = {"model", "prompt", "add_special_tokens", "return_token_strs"}
CHAT_FIELDS = {"model", "messages", "add_generation_prompt", "continue_final_message",
         "add_special_tokens", "return_token_strs", "tools", "chat_template_kwargs"}
CONTENT_FIELDS = {"model", "content", "add_special", "parse_special", "with_pieces"}


def add_routes(app: FastAPI, service: Any, authorized: Any) -> None:
    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(request: Request) -> JSONResponse:
        body = _checked(await pipeline.read_body(request), service)
        fields = service.fields(request, API)
        answer = _content(body, service, fields) if "content" in body else \
            _tokenize(body, service, fields)
        service.count(request, 200)
        return JSONResponse(answer)

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(request: Request) -> JSONResponse:
        body = _checked(await pipeline.read_body(request), service)
        service.fields(request, API).check(body, {"model", "tokens"})
        text = service.model.decode(_ids(body.get("tokens"), service.model.engine.vocab_size),
                                    skip_special_tokens=False)
        service.count(request, 200)
        return JSONResponse({"prompt": text, "content": text})

    @app.get("/tokenizer_info", dependencies=[Depends(authorized)])
    async def tokenizer_info(request: Request) -> JSONResponse:
        model = service.model
        info: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                "model_max_length": service.max_length,
                                "vocab_size": model.engine.vocab_size,
                                "chat_template": model.chat_template}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            info[name] = model.special_tokens.get(name)
        service.count(request, 200)
        return JSONResponse(info)


def _checked(body: Any, service: Any) -> dict:
    body = body_object(body)
    if body.get("model") is not None:
        served_model(body, service.names)
    if service.model.tokenizer is None:
        raise bad(None, "this model folder has no tokenizer.json: it takes and gives token "
                          "ids only.")
    return body


def _tokenize(body: dict, service: Any, fields: Fields) -> dict[str, Any]:
    """vLLM's request: a prompt, or messages rendered with the chat template."""
    model = service.model
    if ("prompt" in body) == ("messages" in body):
        raise bad("prompt", "give 'prompt' (text) or 'messages' (a chat), not both or "
                              "neither.")
    chat = "messages" in body
    fields.check(body, CHAT_FIELDS if chat else PROMPT_FIELDS)
    special = boolean(body, "add_special_tokens")
    try:
        if chat:
            ids = model.encode(_render(body, model), add_special_tokens=bool(special))
        else:
            if not isinstance(body["prompt"], str):
                raise bad("prompt", "'prompt' must be a string.")
            ids = model.encode(body["prompt"], add_special_tokens=special is not False)
    except GenerationError as e:
        raise bad("messages" if chat else "prompt", str(e)) from None
    strs = [service.tokens.text(i) for i in ids] if boolean(body, "return_token_strs") \
        else None
    return {"count": len(ids), "max_model_len": service.max_length, "tokens": ids,
            "token_strs": strs}


def _render(body: dict, model: Any) -> str:
    if not model.chat_template:
        raise bad("messages", "this model has no chat template; tokenize a 'prompt'.")
    messages = openai_chat.messages_of(body["messages"])
    tools, _choice, _parallel = structured.tool_fields(body, model.chat_template)
    generation = boolean(body, "add_generation_prompt")
    final = bool(boolean(body, "continue_final_message"))
    if final and generation:
        raise bad("continue_final_message", "'continue_final_message' and "
                    "'add_generation_prompt' cannot both be true.")
    return model.render_chat(messages, generation is not False and not final, tools=tools,
                             template_vars=openai_chat.template_kwargs(body),
                             continue_final_message=final)


def _content(body: dict, service: Any, fields: Fields) -> dict[str, Any]:
    """llama.cpp's request: {"content", "add_special", "with_pieces"}."""
    fields.check(body, CONTENT_FIELDS)
    if not isinstance(body["content"], str):
        raise bad("content", "'content' must be a string.")
    try:
        ids = service.model.encode(body["content"],
                                   add_special_tokens=bool(boolean(body, "add_special")))
    except GenerationError as e:
        raise bad("content", str(e)) from None
    if boolean(body, "with_pieces"):
        return {"tokens": [{"id": i, "piece": service.tokens.text(i)} for i in ids]}
    return {"tokens": ids}


def _ids(tokens: Any, vocab: int) -> list[int]:
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad("tokens", "'tokens' must be a list of token ids.")
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise bad("tokens", f"token id {outside[0]} is outside the vocabulary "
                              f"(0..{vocab - 1}).")
    return tokens
