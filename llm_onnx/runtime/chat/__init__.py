"""Chat: render.py (chat templates rendered as transformers renders them), dialects/ (how each
family of models writes its replies: tool calls, thinking; registered by name, each with its
grammar and its reader), request.py (a chat reply: its tools, its constraint, read back), and
templates/ (chat templates shipped with llm-onnx). Uses structured output and the generation
loop's result types."""
