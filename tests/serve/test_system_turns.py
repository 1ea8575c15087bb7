"""System messages after the first turn (llm_onnx/serve/system_turns.py): rendered where they
stand when the template renders them, folded into the nearest user turn when it refuses them
(Qwen3's raises) or leaves them out (some templates drop them without a word), with the
leading ones joined into one."""

from __future__ import annotations

import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.chat.render import render_chat
from llm_onnx.serve.system_turns import fold, rendered

ANYWHERE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
# Qwen3's own check
FIRST_ONLY = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
              "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
              "<{{ m.role }}>{{ m.content }}{% endfor %}")
DROPS = ("{% for m in messages %}{% if m.role != 'system' or loop.first %}<{{ m.role }}>"
         "{{ m.content }}{% endif %}{% endfor %}")
CLAUDE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
          {"role": "system", "content": "R"}]
CODEX = [{"role": "system", "content": "D1"}, {"role": "system", "content": "D2"},
         {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"},
         {"role": "system", "content": "D3"}, {"role": "user", "content": "V"}]


class Model:
    def __init__(self, template: str) -> None:
        self.template = template

    def render_chat(self, messages, **kwargs) -> str:
        return render_chat(self.template, messages, {}, True)


def test_a_template_that_renders_them_gets_them_where_they_stand():
    messages, text = rendered(Model(ANYWHERE), CLAUDE)
    assert messages == CLAUDE and text == "<system>S<user>U<system>R<assistant>"


@pytest.mark.parametrize("template", [FIRST_ONLY, DROPS])
def test_a_template_that_refuses_or_drops_them_gets_them_folded(template):
    messages, text = rendered(Model(template), CLAUDE)
    assert messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "U\n\nR"}]
    assert text == "<system>S<user>U\n\nR"
    messages, _ = rendered(Model(template), CODEX)
    assert messages == [{"role": "system", "content": "D1\n\nD2"}, {"role": "user", "content": "U"},
                        {"role": "assistant", "content": "A"},
                        {"role": "user", "content": "D3\n\nV"}]


def test_fold_keeps_a_conversation_without_later_system_messages():
    plain = CLAUDE[:2]
    assert fold(plain) == plain
    assert fold([{"role": "system", "content": "R"}]) == [{"role": "system", "content": "R"}]


def test_a_template_error_without_system_messages_is_raised():
    broken = Model("{{ raise_exception('no') }}")
    with pytest.raises(GenerationError):
        rendered(broken, CLAUDE[1:2])
