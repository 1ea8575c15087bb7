"""Structured output: what a reply must match (constraint.py: a JSON schema, any JSON object,
a regex, a grammar, a choice), the llguidance matcher that masks each step's logits
(matcher.py), and everything that checks a JSON schema or tightens one the engine refuses as
written (schema_*.py, json_scan.py). Knows nothing of the engine, generation or chat."""
