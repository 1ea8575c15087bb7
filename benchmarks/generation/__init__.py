"""Generation in one process: speculative decoding's speed-up (speculative), long and concurrent
runs keeping memory flat and results equal to sequential ones (soak)."""
