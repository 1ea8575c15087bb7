"""The generation loop: options.py (GenerationOptions), sampling.py (the batched sampler),
sequence.py (SequenceState: one sequence's tokens, stops, limits), results.py (Result and
TokenEvent: what a sequence gives back), textstream.py (incremental detokenization, stop
strings), generator.py (the step-wise Generator over a cache's rows), model_like.py (what the
Generator needs of its model), prefix.py (what a row's cache keeps for a new prompt),
speculative.py (drafts and verify steps), scheduler.py (continuous batching of concurrent
requests), stats.py. Uses the engine core and structured output; knows nothing of chat."""
