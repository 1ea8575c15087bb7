"""llm-onnx's benchmarks, run from the repository root as `python -m benchmarks.NAME` (`python -m
benchmarks` lists them). docs/benchmarks.md says how each measures; results/README.md is the
ledger of the results kept; research/ holds the one-off probes behind past decisions.

    core/        the shared core: the peers' environment builder (env, llama), the timing loop
                 (timing), the server and its streaming clients (server, clients), the result
                 record (record, machine) and every target (targets)
    peers/       llm-onnx against onnxruntime-genai, llama.cpp and transformers
    serving/     `llm-onnx serve` under load, over an hour, and with structured output
    generation/  speculative decoding; long and concurrent runs in one process
    fidelity/    what an int8 KV cache and the experts' quantization cost a real model
    full_size/   a model at full size: export, load, decode and serve, against llama.cpp
    gpu/         the CUDA path: correctness, speed, serving, speculation, node-by-node diffs
    tools/       export memory, the runtime's session layouts, moving a folder to a GPU machine

Only the standard library is imported here and in core's environment modules: the peer
comparison runs `python -m benchmarks.peers.worker` in venvs that lack llm-onnx."""
