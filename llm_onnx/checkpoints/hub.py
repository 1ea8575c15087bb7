"""Models named by their Hugging Face id, found in the local cache or downloaded once.

    org/name[@revision]          a safetensors checkpoint: config.json, the weights (the index's
                                 shards or model.safetensors), tokenizer and generation files
    org/name[@revision]:QUANT    one .gguf file of the repository, the one whose name carries
                                 that quantization tag, as llama.cpp's ``-hf`` takes it

The cache comes first (no network when it holds the whole checkpoint); then huggingface_hub
downloads only the files the export reads, never pickled weights (*.bin, *.pt, *.pth), into the
same cache, with its progress bars and resumption of a dropped connection. Downloads happen only
here, when a user names a model. ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are read as
huggingface_hub reads them, when the download is asked for.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llm_onnx.checkpoints.hub_cache import (
    ST_MODULES,
    cached_snapshot,
    complete_checkpoint,
    hub_cache_dir,
    hub_offline,
    index_shards,
    module_folders,
    repo_folder,
    write_ref,
)
from llm_onnx.errors import CheckpointError

DEFAULT_ENDPOINT = "https://huggingface.co"
# A prefix that says "the Hub", whatever exists on disk (as Ollama takes hf.co/org/name).
HUB_PREFIXES = ("https://huggingface.co/", "huggingface.co/", "hf.co/")
_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)"
                   r"(?:@(?P<revision>[^:\s]+))?(?::(?P<quant>[A-Za-z0-9][\w.-]*))?")
# The small files open_checkpoint reads beside the weights (config, tokenizer, generation
# defaults, chat template, a sentence-transformers pipeline), wherever its folders are.
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json",
               ST_MODULES, "sentence_bert_config.json")
_SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class HubName:
    """``org/name[@revision][:QUANT]``; ``forced`` when written with an hf.co/ prefix."""

    repo_id: str
    revision: str = "main"
    quant: str | None = None
    forced: bool = False

    def __str__(self) -> str:
        return (self.repo_id + (f"@{self.revision}" if self.revision != "main" else "")
                + (f":{self.quant}" if self.quant else ""))

    @property
    def name(self) -> str:
        """The model's name for its folder: the repository's name, then a revision other than
        main and the quantization tag (``Qwen3-0.6B``, ``Qwen3-0.6B-GGUF-Q4_K_M``)."""
        parts = [self.repo_id.split("/")[1]]
        if self.revision != "main":
            parts.append(re.sub(r"[^\w.-]", "-", self.revision))
        if self.quant:
            parts.append(self.quant)
        return "-".join(parts)


def parse_hub_name(text: str) -> HubName | None:
    """The Hugging Face name ``text`` spells, or None when it cannot be one (``./x``, ``/x``,
    ``x``, ``~/x``, three parts)."""
    forced = text.startswith(HUB_PREFIXES)
    if forced:
        text = text.split("/", 3 if text.startswith("https://") else 1)[-1]
    m = _NAME.fullmatch(text.strip())
    if m is None or ".." in m["repo"] or "--" in m["repo"]:
        return None
    return HubName(m["repo"], m["revision"] or "main", m["quant"], forced)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def fetch_checkpoint(name: HubName, offline: bool = False, progress: bool = True) -> Path:
    """The local path of ``name``: a snapshot folder (safetensors) or a .gguf file, from the
    cache when it holds it, else downloaded into the cache. ``offline`` (or HF_HUB_OFFLINE=1):
    the cache only. CheckpointError, one line, when the model cannot be had."""
    cache = hub_cache_dir()
    found = _from_cache(name, cache)
    if found is not None:
        return found
    if offline or hub_offline():
        raise CheckpointError(_not_cached(name, cache, "--offline" if offline else
                                          "HF_HUB_OFFLINE=1"))
    return _download(name, cache, progress)


def _from_cache(name: HubName, cache: Path) -> Path | None:
    snapshot = cached_snapshot(name.repo_id, name.revision, cache)
    if snapshot is None:
        return None
    if name.quant is None:
        return snapshot if complete_checkpoint(snapshot) else None
    files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
    try:
        return snapshot / pick_gguf(files, name)
    except CheckpointError:
        return None


def _not_cached(name: HubName, cache: Path, why: str) -> str:
    include = (f"--include '*{name.quant}*.gguf'" if name.quant else
               "--include '*.safetensors' --include '*.json' --include '*.jinja'")
    revision = f" --revision {name.revision}" if name.revision != "main" else ""
    undo = "drop --offline" if why == "--offline" else "unset HF_HUB_OFFLINE"
    return (f"{name} is not in the Hugging Face cache ({cache}) and downloads are off ({why}): "
            f"download it with `hf download {name.repo_id} {include}{revision}`, or {undo}.")


def pick_gguf(files: list[str], name: HubName) -> str:
    """The one .gguf file of ``files`` whose name carries the tag ``name.quant`` as a whole word,
    any case (Q4_K picks model-Q4_K.gguf, not model-Q4_K_M.gguf); vision projectors (mmproj)
    left out. CheckpointError listing the .gguf files when none or several match, or when
    ``name`` has no tag (a GGUF repository holds one file per quantization: name one)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf")
                   and "mmproj" not in PurePosixPath(f).name.lower())
    hits = []
    if name.quant is not None:
        tag = re.compile(rf"(?<![a-z0-9]){re.escape(name.quant.lower())}(?![a-z0-9_])")
        hits = [f for f in ggufs if tag.search(PurePosixPath(f).name.lower())]
    if len(hits) == 1 and not _SPLIT_GGUF.search(hits[0]):
        return hits[0]
    if hits and all(_SPLIT_GGUF.search(f) for f in hits):
        raise CheckpointError(f"{name}: {hits[0]} is one part of a split GGUF; llm-onnx reads a "
                              "GGUF in one file (join it with llama.cpp's llama-gguf-split "
                              "--merge and pass the file).")
    repo = name.repo_id + (f"@{name.revision}" if name.revision != "main" else "")
    what = (f"{len(ggufs)} .gguf file{'s' * (len(ggufs) != 1)}" if name.quant is None else
            f"no .gguf file named with {name.quant}" if not hits else
            f"{len(hits)} .gguf files named with {name.quant}")
    raise CheckpointError(f"{repo} has {what}; name one as {name.repo_id}:TAG. Its .gguf "
                          f"files: {', '.join(ggufs) if ggufs else 'none'}.")


def _download(name: HubName, cache: Path, progress: bool) -> Path:
    from huggingface_hub import HfApi, hf_hub_download

    endpoint = hub_endpoint()
    with _hub_errors(name, endpoint):
        info = HfApi(endpoint=endpoint).model_info(name.repo_id, revision=name.revision,
                                                   files_metadata=True)
    commit = info.sha
    if info.gated and not _token():  # refused without a token: say so before any file
        raise CheckpointError(f"{name.repo_id} is a gated model: {_gated_how(endpoint, name)}.")
    if not commit:
        raise CheckpointError(f"{name}: {endpoint} gave no commit for revision "
                              f"{name.revision}; is HF_ENDPOINT a Hugging Face hub?")
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}

    def get(file: str) -> Path:
        with _hub_errors(name, endpoint, file):
            return Path(hf_hub_download(name.repo_id, file, revision=commit, cache_dir=cache,
                                        endpoint=endpoint))

    def announce(files: list[str]) -> None:
        if progress:
            total = sum(sizes.get(f, 0) for f in files)
            print(f"Downloading {name} ({commit[:8]}): {len(files)} file(s), "
                  f"{human_size(total)}, into {cache}", file=sys.stderr)

    if name.quant is not None:
        file = pick_gguf(list(sizes), name)
        announce([file])
        path = get(file)
        write_ref(name.repo_id, name.revision, commit, cache)
        return path
    small, weights = _plan(name, sizes, get)
    announce(small + weights)
    for file in small + weights:  # the weights last: with them all there, the rest is too
        get(file)
    write_ref(name.repo_id, name.revision, commit, cache)
    return repo_folder(name.repo_id, cache) / "snapshots" / commit


def _plan(name: HubName, sizes: dict[str, int], get) -> tuple[list[str], list[str]]:
    """The small files and the weight files to download; reads modules.json and the index
    (downloading them) to know which."""
    files = set(sizes)
    folders, transformer = [""], ""
    if ST_MODULES in files:
        transformer, more = module_folders(json.loads(get(ST_MODULES).read_text("utf-8")))
        folders += more

    def at(file: str) -> str:
        return str(PurePosixPath(transformer) / file) if transformer else file

    if at("config.json") not in files:
        if any(f.lower().endswith(".gguf") for f in files):
            pick_gguf(sorted(files), name)  # raises, listing them: a tag is needed
        where = f" in {transformer}" if transformer else ""
        raise CheckpointError(f"{name} holds no config.json{where}; llm-onnx reads a Hugging "
                              "Face checkpoint (config.json and safetensors) or a .gguf file.")
    small = sorted(f for f in files if PurePosixPath(f).name in SMALL_FILES
                   and f.rpartition("/")[0] in folders)
    if at("model.safetensors.index.json") in files:
        shards = index_shards(get(at("model.safetensors.index.json")))
        if not shards:
            raise CheckpointError(f"{name}: {at('model.safetensors.index.json')} lists no "
                                  "shards (weight_map).")
        weights = [at(s) for s in shards]
        missing = [f for f in weights if f not in files]
        if missing:
            raise CheckpointError(f"{name}: {missing[0]}, listed in "
                                  f"{at('model.safetensors.index.json')}, is not in the "
                                  "repository.")
    elif at("model.safetensors") in files:
        weights = [at("model.safetensors")]
    else:
        pickles = sorted(f for f in files if f.endswith((".bin", ".pt", ".pth")))
        raise CheckpointError(
            f"{name} has no safetensors weights" + (f" (only {', '.join(pickles[:3])})"
                                                     if pickles else "")
            + "; llm-onnx reads safetensors or a .gguf file, never pickled weights.")
    return small, weights


def human_size(n: float) -> str:
    """1234567 -> '1.2 MB' (powers of 1000, as the Hub shows sizes)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


@contextmanager
def _hub_errors(name: HubName, endpoint: str, file: str | None = None) -> Iterator[None]:
    """huggingface_hub's errors as one line that says what to do."""
    try:
        yield
    except Exception as e:
        explained = _explain(e, name, endpoint, file)
        if explained is None:
            raise
        raise explained from e


def _explain(e: Exception, name: HubName, endpoint: str,
             file: str | None) -> CheckpointError | None:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    while isinstance(e, LocalEntryNotFoundError) and isinstance(e.__cause__, Exception):
        e = e.__cause__  # "cannot find it in the cache" hides why the Hub did not give it
    page = f"{endpoint}/{name.repo_id}"
    if isinstance(e, GatedRepoError):
        return CheckpointError(f"{name.repo_id} is a gated model: {_gated_how(endpoint, name)}.")
    if isinstance(e, RepositoryNotFoundError):
        return CheckpointError(
            f"{name.repo_id}: no such local file or folder, and no model of that name on "
            f"{endpoint} (if it is private, set HF_TOKEN to a token that can read it).")
    if isinstance(e, RevisionNotFoundError):
        return CheckpointError(f"{name.repo_id} has no revision {name.revision!r} (a branch, tag "
                               f"or commit on {page}).")
    if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
        return CheckpointError(f"{name}: {file} is listed but cannot be downloaded from "
                               f"{endpoint}.")
    if isinstance(e, HfHubHTTPError):
        status = e.response.status_code if getattr(e, "response", None) is not None else None
        if status in (401, 403):
            return CheckpointError(
                f"{name.repo_id}: {endpoint} refused access ({status}); set HF_TOKEN to a token "
                f"that can read it (or run `hf auth login`), and accept its licence on {page} if "
                "it is gated.")
        return CheckpointError(f"{name}: {endpoint} answered {status} ({_first_line(e)}); try "
                               "again later (what was downloaded is kept).")
    what = f"downloading {file}" if file else "listing its files"
    if isinstance(e, OSError):  # a full disk, a dropped connection that did not resume
        return CheckpointError(f"{name}: {what} from {endpoint} failed ({_first_line(e)}); run "
                               "again to retry (a partial file is never used), or pass --offline "
                               "to use the cache only.")
    # The HTTP client's own connection errors (httpx, requests) are not OSErrors.
    if type(e).__module__.split(".")[0] in ("httpx", "httpx2", "requests", "urllib3"):
        return CheckpointError(f"{name}: cannot reach {endpoint} for {what} ({type(e).__name__}: "
                               f"{_first_line(e)}); check the network, or pass --offline to use "
                               "the cache only.")
    return None


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _gated_how(endpoint: str, name: HubName) -> str:
    page = f"{endpoint}/{name.repo_id}"
    if _token():
        return ("the token in use (HF_TOKEN or `hf auth login`) has no access yet: accept the "
                f"licence on {page} with that token's account")
    return (f"accept its licence on {page}, then set HF_TOKEN to a token of that account (or "
            "run `hf auth login`)")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
