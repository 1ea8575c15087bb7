"""A model at full size on one machine: `python -m benchmarks.full_size` exports random weights
of a preset, loads, decodes and serves it, and runs llama.cpp on a GGUF of the same shape
(random_gguf), each system measured alone (alone)."""
