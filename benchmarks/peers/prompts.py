"""The prompts every system gets, as token ids made once with the model's tokenizer (so nothing
adds a BOS token): the greedy-agreement prompts, the plain texts of the teacher-forced fidelity
measure and the speed text. Standard library only (the load test takes its prompts from the same
texts)."""

from __future__ import annotations

import json
from pathlib import Path

AGREEMENT_PROMPTS = [
    # (name, text, use the chat template)
    ("factual", "What is the capital of France, and what is the city famous for?", True),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("story", "Once upon a time, in a small village at the edge of a great forest,", False),
]

# Teacher-forced fidelity (besides the three agreement prompts): plain text openings of varied kinds.
# Every system is fed transformers fp32's own greedy continuation of each, and at every position
# its next-token distribution is compared with transformers' (KL divergence, top-1 match): a
# measure of quantization error that a single near-tie cannot flip, unlike free-running agreement.
FIDELITY_TEXTS = [
    "The history of the Roman Empire begins",
    "Photosynthesis is the process by which",
    "To install Python on Linux, first",
    "My favourite recipe for pancakes needs",
    "In mathematics, a prime number",
    "The stock market fell sharply today because",
    "Dear hiring manager, I am writing to",
    "import numpy as np\n\ndef softmax(x):",
    "The three laws of motion state that",
    "Climate change affects coastal cities by",
    "Once the spaceship landed on Mars,",
    "A good night's sleep helps the brain",
]

SPEED_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press into a system that could "
    "produce books far faster than any scribe. Within a few decades, printing shops had spread "
    "across Europe, from Venice to London, and the price of books fell sharply. Scholars could now "
    "compare identical copies of a text, which changed how knowledge was checked and shared. "
    "Pamphlets carried news and arguments to readers who had never owned a book before, and "
    "literacy rose in the cities first, then in the countryside. Printers standardised spelling "
    "and grammar, often without meaning to, simply by choosing one form and repeating it in "
    "thousands of copies. Maps, scientific tables and musical scores could be reproduced without "
    "the errors that hand copying introduced, so astronomers and navigators worked from the same "
    "numbers. Governments and churches soon tried to control what was printed, licensing presses "
    "and banning books, but the sheer number of presses made censorship difficult. By the end of "
    "the sixteenth century, millions of volumes were in circulation, and the way people learned, "
    "argued and remembered had changed for good."
)


def make_prompts(args) -> None:
    """Token ids of the agreement prompts and of the speed prompt, with the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf)
    agreement = []
    for name, text, chat in AGREEMENT_PROMPTS:
        if chat:
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tok.encode(text, add_special_tokens=False)
        agreement.append({"name": name, "text": text, "chat_template": chat,
                          "ids": [int(i) for i in ids]})
    speed = tok.encode(SPEED_TEXT, add_special_tokens=False)
    while len(speed) < args.prompt_len:
        speed = speed + speed
    speed = [int(i) for i in speed[:args.prompt_len]]
    fidelity = [{"name": f"text{i + 1}", "text": t, "ids": tok.encode(t, add_special_tokens=False)}
                for i, t in enumerate(FIDELITY_TEXTS)]
    data = {"agreement": agreement, "fidelity": fidelity,
            "speed": {"text": tok.decode(speed), "ids": speed}}
    Path(args.result).write_text(json.dumps(data, indent=1))
