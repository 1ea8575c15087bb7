"""The benchmarks' shared core: proc (children, stamps), machine and record (the one result
record), timing (the one timing loop), env and llama (the one environment builder for the
peers), server and clients (a server under streaming clients), targets (every target)."""
