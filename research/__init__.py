"""One-off probes behind past decisions, kept runnable as a record (`python -m research.NAME`
from the repository root). research/README.md says for each what it asked, what it found, when,
and which page of the docs holds the answer."""
