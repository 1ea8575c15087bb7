"""The engine core: ONNX Runtime sessions over a model folder (engine.py; embedder.py for an
embedding model's folder; engines.py opens the one a folder needs), the per-row state they
update in place (state.py: the interface; kv_cache.py: keys and values; recurrent.py),
execution providers (providers.py) and the model folder's external-data check
(onnx_check.py). Knows nothing of sampling, generation or chat."""
