"""The messages of an Anthropic Messages request as the chat template takes them (as OpenAI's chat
does): tool_use blocks are the assistant's ``tool_calls``, tool_result blocks ``tool`` messages,
thinking its ``reasoning_content``, the text blocks of a message its content (joined by blank
lines). Consecutive messages of one role are one turn (Anthropic combines them); the first turn
must be the user's. A ``system`` message among them (Claude Code sends its reminders so, after
the user's turn) is a system turn where it stands (system_turns.py folds it into a user turn for
a template that cannot render it there). A final assistant message is a prefill: the reply
continues its text. Every refusal is a 400 naming the block by its path
(``messages.1.content.0``), as Anthropic names them.
"""

from __future__ import annotations

from typing import Any

from llm_onnx.serve.errors import bad, text_only
from llm_onnx.serve.media import image_part, takes_images


def text(content: Any, where: str) -> str:
    """A string, or a list of text blocks joined by blank lines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of text blocks.")
    texts = []
    for i, block in enumerate(content):
        kind = _kind(block, f"{where}.{i}")
        if kind in ("image", "document"):
            raise text_only(f"{where}.{i}", f"an {kind} block")
        if kind != "text":
            raise bad(f"{where}.{i}.type", f"expected a text block, got {kind!r}.")
        texts.append(_block_text(block, f"{where}.{i}"))
    return "\n\n".join(texts)


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad(where, "a content block must be an object with a 'type'.")
    return block["type"]


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str) or not block["text"]:
        raise bad(f"{where}.text", "text content blocks must be non-empty strings.")
    return block["text"]


def chat_messages(messages: Any, system: Any) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of the top-level ``system`` and ``messages``, and whether the last one
    is a prefill (see the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects.")
    leading = [] if system is None or system in ("", []) else [text(system, "system")]
    turns: list[tuple[str, list[tuple[str, dict]]]] = []  # role, [(path, block)]
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict) or set(m) - {"role", "content"}:
            raise bad(where, "a message is an object with 'role' and 'content' only.")
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad(f"{where}.role", f"must be 'user', 'assistant' or 'system', got {role!r}.")
        content = m.get("content")
        if role == "system":
            said = "" if content in ("", []) else text(content, f"{where}.content")
            if said and not turns:  # before the first turn: with the top-level system
                leading.append(said)
            elif said:
                turns.append(("system", [(where, {"type": "text", "text": said})]))
            continue
        if not turns and role != "user":
            raise bad(f"{where}.role", "the first message must use the 'user' role.")
        blocks = [(f"{where}.content", {"type": "text", "text": content})] \
            if isinstance(content, str) else None
        if blocks is None:
            if not isinstance(content, list):
                raise bad(f"{where}.content", "must be a string or a list of content blocks.")
            blocks = [(f"{where}.content.{j}", b) for j, b in enumerate(content)]
        if not blocks:
            if role == "assistant" and i == len(messages) - 1:
                continue  # an empty final message: nothing to continue
            raise bad(f"{where}.content", "must not be empty (only the final assistant "
                                            "message may be).")
        if turns and turns[-1][0] == role:  # one turn, as Anthropic combines them
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    if not turns:
        raise bad("messages", "must hold a user message (system messages alone are not a "
                                "conversation).")
    out = [{"role": "system", "content": "\n\n".join(leading)}] if leading else []
    calls: dict[str, str] = {}
    for k, (role, blocks) in enumerate(turns):
        last = k == len(turns) - 1
        if role == "system":  # a tool_use it follows is answered by the user turn after it
            out.append({"role": "system", "content": blocks[0][1]["text"]})
        elif role == "user":
            out += _user(blocks, calls)
            calls = {}
        else:
            message, calls = _assistant(blocks, last)
            if message is not None:
                out.append(message)
    return out, out[-1]["role"] == "assistant"


def _user(blocks: list[tuple[str, dict]], calls: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages, then its text."""
    out, texts, answered = [], [], set()
    parts: list[dict[str, Any]] = []  # with images: the turn's text and image parts in order
    for where, block in blocks:
        kind = _kind(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            out.append(_tool_result(block, where, calls))
            answered.add(block["tool_use_id"])
        elif kind == "document":
            raise text_only(where, f"a {kind} block")
        else:
            raise bad(f"{where}.type", f"{kind!r} blocks are not supported in a user message "
                                         "(text, image and tool_result are).")
    missing = [i for i in calls if i not in answered]
    if missing:
        raise bad(blocks[0][0].rsplit(".content", 1)[0], "tool_use ids were found without "
                    f"tool_result blocks immediately after: {', '.join(missing)}. Each tool_use "
                    "block must have a tool_result block in the next message.")
    if any(p["type"] == "image" for p in parts):  # text blocks apart by blank lines, as ever
        shown = [{"type": "text", "text": "\n\n" + p["text"]} if p["type"] == "text" and any(
            q["type"] == "text" for q in parts[:k]) else p for k, p in enumerate(parts)]
        out.append({"role": "user", "content": shown})
    elif texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _image(block: dict, where: str) -> dict[str, Any]:
    """An image block: its ``source`` (base64 with a media_type, or a url) as the template's
    image part (serve/media.py decides what may be fetched)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str) or not data:
            raise bad(f"{where}.source", "a base64 image source needs 'media_type' and 'data'.")
        return image_part(f"data:{media};base64,{data}", where, "an image block")
    if kind == "url":
        return image_part(source.get("url"), where, "an image block")
    if takes_images():
        raise bad(f"{where}.source", "an image block's source is {\"type\": \"base64\", "
                                     "\"media_type\", \"data\"} or {\"type\": \"url\", \"url\"}.")
    raise text_only(where, "an image block")


def _tool_result(block: dict, where: str, calls: dict[str, str]) -> dict[str, Any]:
    tool_id = block.get("tool_use_id")
    if not isinstance(tool_id, str):
        raise bad(f"{where}.tool_use_id", "must be a string (the tool_use block's id).")
    if tool_id not in calls:
        raise bad(f"{where}.tool_use_id", f"unexpected tool_use_id {tool_id!r} in a "
                    "tool_result block: each tool_result must answer a tool_use block of the "
                    "previous (assistant) message.")
    content = block.get("content", "")
    said = "" if content in ("", []) else text(content, f"{where}.content")
    if block.get("is_error") not in (None, False, True):
        raise bad(f"{where}.is_error", "must be true or false.")
    if block.get("is_error"):
        said = f"Error: {said}"
    return {"role": "tool", "tool_call_id": tool_id, "name": calls[tool_id], "content": said}


def _assistant(blocks: list[tuple[str, dict]], last: bool,
               ) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """An assistant turn as one message (None: empty and last), and its calls {id: name}."""
    texts, thinking, calls = [], [], []
    for where, block in blocks:
        kind = _kind(block, where)
        if kind == "text":
            if block.get("text") == "" and last and len(blocks) == 1:
                return None, {}  # an empty final message: nothing to continue
            texts.append(_block_text(block, where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise bad(f"{where}.thinking", "must be a string.")
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind != "redacted_thinking":
            raise bad(f"{where}.type", f"{kind!r} blocks are not supported in an assistant "
                        "message (text, thinking and tool_use are).")
    if last and calls:
        raise bad(blocks[0][0].rsplit(".content", 1)[0], "the final assistant message is "
                    "continued by the reply, so it may not hold tool_use blocks; add the "
                    "tool_result in a user message after it.")
    if last and texts and texts[-1] != texts[-1].rstrip():
        raise bad(blocks[-1][0], "final assistant content cannot end with trailing "
                                   "whitespace.")
    if last and not texts:
        raise bad(blocks[0][0], "the final assistant message (a prefill the reply "
                                  "continues) must hold text.")
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if thinking:
        message["reasoning_content"] = "\n\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message, {c["id"]: c["function"]["name"] for c in calls}


def _tool_use(block: dict, where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise bad(f"{where}.id", "must be a non-empty string.")
    if not isinstance(block.get("name"), str) or not block["name"]:
        raise bad(f"{where}.name", "must be a non-empty string.")
    if not isinstance(block.get("input"), dict):
        raise bad(f"{where}.input", "must be an object (the tool's arguments).")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": block["input"]}}
