"""Cut the two operations llm-onnx serves (POST /chat/completions and POST /completions) out of
OpenAI's published OpenAPI description, with every component they reach, into
``openai-openapi.subset.json`` beside this file.

    python tests/conformance/vendor_spec.py PATH/TO/openai-openapi/openapi.json COMMIT

Source: https://github.com/openai/openai-openapi (MIT licence, LICENSE.openai-openapi here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
OPERATIONS = {"/chat/completions": "post", "/completions": "post", "/responses": "post",
              "/embeddings": "post"}


def refs(node, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            found.add(ref)
        for value in node.values():
            refs(value, found)
    elif isinstance(node, list):
        for value in node:
            refs(value, found)


def subset(spec: dict) -> dict:
    paths = {path: {method: spec["paths"][path][method]} for path, method in OPERATIONS.items()}
    seen: set[str] = set()
    todo: set[str] = set()
    refs(paths, todo)
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        refs(spec["components"][kind][name], todo)
    components: dict = {}
    for ref in sorted(seen):
        _, _, kind, name = ref.split("/", 3)
        components.setdefault(kind, {})[name] = spec["components"][kind][name]
    return {"openapi": spec["openapi"], "info": spec["info"], "servers": spec.get("servers", []),
            "paths": paths, "components": components}


def main() -> None:
    source, commit = Path(sys.argv[1]), sys.argv[2]
    out = subset(json.loads(source.read_text()))
    out["info"] = dict(out["info"], **{"x-vendored-from": "https://github.com/openai/openai-openapi",
                                        "x-vendored-commit": commit})
    (HERE / "openai-openapi.subset.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
