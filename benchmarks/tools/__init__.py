"""Tools around the benchmarks: export memory of a full-size preset (export_memory), the runtime's
session layouts (runtime_memory), a random-weights folder moved to a GPU machine in a few MiB
(refill_weights)."""
