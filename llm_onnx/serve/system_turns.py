"""System messages after the conversation has begun, as every chat API renders them.

Coding agents send them: Claude Code its reminders (a ``system`` message after the user's turn),
Codex CLI its ``developer`` messages (two before the user's, more between turns). A chat
template renders each where it stands when it can; many cannot (Qwen3's raises "System message
must be at the beginning", Gemma's and Mistral's allow one system turn, some drop the rest
without a word). Then they are folded as Anthropic folds them: the leading system messages
become one, and each later one is added to the user turn after it (before it, if none follows),
so the model still reads every instruction.

    messages, text = rendered(model, messages, tools=..., template_vars=...)
"""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import GenerationError


def rendered(model: Any, messages: list[dict[str, Any]], **render: Any,
             ) -> tuple[list[dict[str, Any]], str]:
    """(the messages as rendered, the prompt's text): ``model.render_chat(messages, **render)``,
    or of the messages folded (see the module docstring) when the template refuses a system
    message where it stands or leaves it out."""
    later = _later_systems(messages)
    if not later:
        return messages, model.render_chat(messages, **render)
    try:
        text = model.render_chat(messages, **render)
        if all(_shown(messages[i]["content"], text) for i in later):
            return messages, text
    except GenerationError:
        pass
    folded = fold(messages)
    return folded, model.render_chat(folded, **render)


def fold(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with one leading system message at most, and no other: the leading ones
    joined by blank lines, each later one joined to the nearest user turn after it (else
    before it; a conversation with no user message keeps it as it is)."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    out: list[dict[str, Any]] = []
    if lead:
        out.append({"role": "system", "content": "\n\n".join(
            _content(m) for m in messages[:lead] if _content(m))})
    pending: list[str] = []  # later system texts waiting for the next user turn
    for m in messages[lead:]:
        if m["role"] == "system":
            pending.append(_content(m))
        elif m["role"] == "user" and pending:
            out.append({**m, "content": _joined(pending, m)})
            pending = []
        else:
            out.append(m)
    if pending:
        user = next((i for i in range(len(out) - 1, -1, -1) if out[i]["role"] == "user"), None)
        if user is None:
            out += [{"role": "system", "content": text} for text in pending]
        else:
            out[user] = {**out[user], "content": "\n\n".join([_content(out[user]), *pending])}
    return out


def _later_systems(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the system messages that do not lead the conversation, and of the leading
    ones after the first (a template may take one system message only)."""
    return [i for i, m in enumerate(messages) if m["role"] == "system" and i > 0]


def _joined(pending: list[str], message: dict[str, Any]) -> Any:
    """A user turn with the system texts ``pending`` before its own (a turn of content parts,
    images among them, keeps its parts after them)."""
    content = message.get("content")
    if isinstance(content, list):
        return [{"type": "text", "text": "\n\n".join(pending) + "\n\n"}, *content]
    return "\n\n".join([*pending, _content(message)])


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _shown(content: Any, text: str) -> bool:
    """Whether a message's text is in the rendered prompt (a sample of it: a template may trim
    the message's ends)."""
    if not isinstance(content, str) or not content.strip():
        return True
    sample = content.strip()
    return sample[:200] in text and sample[-200:] in text
