"""Chat: render.py (chat templates rendered as transformers renders them), tools.py (the formats
models write tool calls in: grammars and parsers), reasoning.py (a reasoning model's thinking
apart from its answer), request.py (a chat reply's constraint, tools and template files), and
templates/ (chat templates shipped with llm-onnx). Uses structured output and the generation
loop's result types."""
