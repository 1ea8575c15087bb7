"""The CUDA path on a GPU: correctness, speed and memory (check), serving (serve), prompt-lookup
speculation (speculative), where a graph's CUDA run parts from its CPU run (node_diff). Each has
a --smoke run on the CPU, which the tests run."""
