"""`--checkpoint org/name[@revision][:QUANT]`: a model named by its Hugging Face id is read from
the local cache, else downloaded through huggingface_hub from HF_ENDPOINT, here a local server
that speaks the Hub's file API (tests/checkpoints/fake_hub.py); never the internet."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_onnx.checkpoints.hub import SMALL_FILES, HubName, parse_hub_name, pick_gguf
from llm_onnx.checkpoints.hub_cache import hub_cache_dir, repo_folder
from llm_onnx.checkpoints.load import TOKENIZER_FILES
from llm_onnx.cli import main, resolve_checkpoint
from llm_onnx.errors import CheckpointError
from llm_onnx.families import get_config
from tests.checkpoints.fake_hub import FakeHub
from tests.hf_models import save_hf_checkpoint

JUNK = {"pytorch_model.bin": b"pickle" * 100, "model.pt": b"pickle", "README.md": b"# tiny",
        "onnx/config.json": b"{}", "onnx/model.onnx": b"onnx" * 100}


@pytest.fixture(autouse=True)
def hub_env(tmp_path, monkeypatch):
    """A private HOME (so the Hugging Face cache is tmp_path's), no token, online."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # closed, until a test serves one


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random Llama saved by transformers, with a tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_hf_checkpoint(get_config("llama_tiny"), folder, seed=3, tokenizer=True)
    return folder


def files_of(folder: Path, **extra: bytes) -> dict[str, bytes]:
    files = {p.relative_to(folder).as_posix(): p.read_bytes()
             for p in folder.rglob("*") if p.is_file()}
    return {**files, **JUNK, **extra}


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def test_names():
    assert parse_hub_name("Qwen/Qwen3-0.6B") == HubName("Qwen/Qwen3-0.6B")
    assert parse_hub_name("Qwen/Qwen3-0.6B@v2.0") == HubName("Qwen/Qwen3-0.6B", "v2.0")
    assert parse_hub_name("unsloth/Qwen3-0.6B-GGUF:Q4_K_M") == \
        HubName("unsloth/Qwen3-0.6B-GGUF", quant="Q4_K_M")
    assert parse_hub_name("org/m@dev:q8_0") == HubName("org/m", "dev", "q8_0")
    assert parse_hub_name("hf.co/org/m") == HubName("org/m", forced=True)
    assert parse_hub_name("https://huggingface.co/org/m:Q8_0") == \
        HubName("org/m", quant="Q8_0", forced=True)
    for path in ("./org/m", "/org/m", "~/m", "m", "a/b/c", "m.gguf", "org/../x", "org/a--b"):
        assert parse_hub_name(path) is None, path
    assert HubName("Qwen/Qwen3-0.6B", "v2", "Q8_0").name == "Qwen3-0.6B-v2-Q8_0"
    # every file open_checkpoint reads beside the weights is one a download fetches
    assert set(TOKENIZER_FILES) <= set(SMALL_FILES)


def test_download_then_export_then_the_cache(hub, checkpoint, tmp_path, monkeypatch):
    """Only the files the export reads are fetched (no pickles, no README, no onnx/), the
    folder goes to models/<name>-<precision>, and a second run asks the server nothing."""
    commit = hub.add("org/tiny-llama", files_of(checkpoint))
    monkeypatch.chdir(tmp_path)
    result = run("export", "--checkpoint", "org/tiny-llama", "--precision", "fp32",
                 "--max-seq-len", "32", "--no-validate", "--no-huge-pages")
    assert result.exit_code == 0, result.output
    assert {f for f, _ in hub.gets()} == {"config.json", "generation_config.json",
                                          "tokenizer.json", "model.safetensors"}
    assert not any(f.endswith((".bin", ".pt", ".md", ".onnx")) or f.startswith("onnx/")
                   for f in hub.file_requests())
    folder = tmp_path / "models" / "tiny-llama-fp32"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "tokenizer.json" in manifest["files"]
    assert (repo_folder("org/tiny-llama") / "refs" / "main").read_text() == commit

    hub.requests.clear()
    ckpt = resolve_checkpoint(None, "org/tiny-llama", False)
    assert hub.requests == []
    assert ckpt.name == "tiny-llama" and ckpt.path == \
        hub_cache_dir() / "models--org--tiny-llama" / "snapshots" / commit
    assert resolve_checkpoint(None, "org/tiny-llama", False, offline=True).path == ckpt.path


def test_the_default_out_is_checked_before_downloading(hub, checkpoint, tmp_path, monkeypatch):
    hub.add("org/tiny-llama", files_of(checkpoint))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny-llama-int8").mkdir(parents=True)
    (tmp_path / "models" / "tiny-llama-int8" / "notes.txt").write_text("mine")
    result = run("export", "--checkpoint", "org/tiny-llama", "--precision", "int8",
                 "--no-huge-pages")
    assert result.exit_code == 1 and "already exists" in result.output, result.output
    assert hub.requests == []


def test_a_sharded_checkpoint_fetches_the_index_and_its_shards(hub, tmp_path):
    """Shards as the index lists them; a consolidated copy of the weights beside them, which
    the index does not list, is never fetched."""
    folder = tmp_path / "sharded"
    model = save_hf_checkpoint(get_config("llama_tiny"), folder, seed=4)
    model.save_pretrained(folder, max_shard_size="100KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    hub.add("org/sharded", files_of(folder, **{"consolidated.safetensors": b"x" * 1000}))
    ckpt = resolve_checkpoint(None, "org/sharded", False)
    assert {f for f, _ in hub.gets()} == {"config.json", "generation_config.json",
                                          "model.safetensors.index.json", *shards}
    assert ckpt.source is not None and ckpt.config.num_hidden_layers == 2


def test_a_revision(hub, checkpoint, tmp_path):
    """org/name@branch and org/name@commit: each its own snapshot, cached under its ref."""
    main_commit = hub.add("org/tiny-llama", files_of(checkpoint))
    other = tmp_path / "v1"
    save_hf_checkpoint(get_config("llama_tiny"), other, seed=11)
    v1_commit = hub.add("org/tiny-llama", files_of(other), branch="v1")
    ckpt = resolve_checkpoint(None, "org/tiny-llama@v1", False)
    assert ckpt.path.name == v1_commit and ckpt.name == "tiny-llama-v1"
    assert (ckpt.path / "model.safetensors").read_bytes() == \
        (other / "model.safetensors").read_bytes()
    assert (repo_folder("org/tiny-llama") / "refs" / "v1").read_text() == v1_commit
    assert not (repo_folder("org/tiny-llama") / "refs" / "main").exists()
    by_commit = resolve_checkpoint(None, f"org/tiny-llama@{main_commit}", False)
    assert by_commit.path.name == main_commit
    hub.requests.clear()
    assert resolve_checkpoint(None, f"org/tiny-llama@{main_commit}", False,
                              offline=True).path == by_commit.path
    assert resolve_checkpoint(None, "org/tiny-llama@v1", False, offline=True).path == ckpt.path
    assert hub.requests == []
    with pytest.raises(CheckpointError, match="org/tiny-llama has no revision 'v9'"):
        resolve_checkpoint(None, "org/tiny-llama@v9", False)


def test_offline_and_not_cached_is_one_line_saying_how(hub, checkpoint, monkeypatch):
    hub.add("org/tiny-llama", files_of(checkpoint))
    result = run("export", "--checkpoint", "org/tiny-llama", "--offline", "--no-huge-pages")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "org/tiny-llama is not in the Hugging Face cache" in result.output
    assert "`hf download org/tiny-llama --include '*.safetensors'" in result.output
    assert "drop --offline" in result.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match=r"--include '\*Q8_0\*.gguf' --revision dev`, or "
                                              "unset HF_HUB_OFFLINE"):
        resolve_checkpoint(None, "org/tiny-llama@dev:Q8_0", False)
    assert hub.requests == []


def test_gated_needs_a_token(hub, checkpoint, monkeypatch):
    hub.add("org/gated", files_of(checkpoint), gated_token="hf_secret")
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(None, "org/gated", False)
    assert "org/gated is a gated model: accept its licence on" in str(e.value)
    assert "set HF_TOKEN" in str(e.value) and "\n" not in str(e.value)
    assert hub.file_requests() == []  # said before any file
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(CheckpointError, match="the token in use .* has no access yet"):
        resolve_checkpoint(None, "org/gated", False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert resolve_checkpoint(None, "org/gated", False).config.num_hidden_layers == 2


@pytest.mark.parametrize("status", [401, 404])
def test_an_unknown_repo_is_named(hub, status):
    hub.missing_status = status
    result = run("export", "--checkpoint", "org/nothing-here", "--no-huge-pages")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "org/nothing-here: no such local file or folder, and no model of that name on " \
        f"{hub.url}" in result.output


def test_no_hub_reachable_is_one_line(monkeypatch):
    with pytest.raises(CheckpointError, match="pass --offline to use the cache only"):
        resolve_checkpoint(None, "org/tiny-llama", False)


def test_a_repo_with_pickles_only_is_refused(hub):
    hub.add("org/old", {"config.json": b"{}", "pytorch_model.bin": b"x"})
    with pytest.raises(CheckpointError, match=r"org/old has no safetensors weights \(only "
                                              r"pytorch_model.bin\).*never pickled"):
        resolve_checkpoint(None, "org/old", False)
    assert "pytorch_model.bin" not in hub.file_requests()


def test_a_dropped_connection_resumes(hub, checkpoint, monkeypatch):
    """The weights' connection drops halfway: huggingface_hub asks for the rest (Range), from
    the last whole chunk it wrote (10 MB; 16 KB here, for a checkpoint of 0.3 MB), and the file
    is whole."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    hub.add("org/tiny-llama", files_of(checkpoint))
    hub.faults["model.safetensors"] = "cut"
    ckpt = resolve_checkpoint(None, "org/tiny-llama", False)
    ranges = [h.get("Range") or h.get("range") for f, h in hub.gets() if f == "model.safetensors"]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes=")
    assert (ckpt.path / "model.safetensors").read_bytes() == \
        (checkpoint / "model.safetensors").read_bytes()


def test_a_failed_download_leaves_nothing_a_later_run_trusts(hub, checkpoint):
    """The connection drops and the server then fails: one line, no weights file, no ref in
    the cache; the next run downloads the file whole."""
    hub.add("org/tiny-llama", files_of(checkpoint))
    hub.faults["model.safetensors"] = "cut-then-fail"
    with pytest.raises(CheckpointError, match="answered 500") as e:
        resolve_checkpoint(None, "org/tiny-llama", False)
    assert "\n" not in str(e.value)
    repo = repo_folder("org/tiny-llama")
    assert not (repo / "refs" / "main").exists()
    weights = (checkpoint / "model.safetensors").read_bytes()
    assert not list(repo.rglob("model.safetensors"))
    assert not (repo / "blobs" / hashlib.sha256(weights).hexdigest()).exists()
    assert not list(repo.rglob("*.incomplete"))  # no partial file kept
    with pytest.raises(CheckpointError, match="is not in the Hugging Face cache"):
        resolve_checkpoint(None, "org/tiny-llama", False, offline=True)
    del hub.faults["model.safetensors"]
    ckpt = resolve_checkpoint(None, "org/tiny-llama", False)
    assert (ckpt.path / "model.safetensors").read_bytes() == weights


def test_a_local_path_wins_and_hf_co_forces_the_hub(hub, checkpoint, tmp_path, monkeypatch):
    commit = hub.add("org/tiny-llama", files_of(checkpoint))
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "tiny-llama"
    save_hf_checkpoint(get_config("llama_tiny"), local, seed=5)
    assert resolve_checkpoint(None, "org/tiny-llama", False).path == Path("org/tiny-llama")
    assert hub.requests == []
    assert resolve_checkpoint(None, "hf.co/org/tiny-llama", False).path.name == commit
    for f in local.iterdir():
        f.unlink()
    with pytest.raises(CheckpointError, match=r"org/tiny-llama: the checkpoint folder is empty "
                                              r"\(the local path org/tiny-llama wins over the "
                                              "Hugging Face model of that name; write "
                                              r"hf.co/org/tiny-llama for the model\)\.$"):
        resolve_checkpoint(None, "org/tiny-llama", False)


def test_a_preset_downloads_its_vendors_repository(hub, checkpoint):
    """--config NAME without --random-weights: the repository HF_REPOS names."""
    hub.add("HuggingFaceTB/SmolLM2-135M-Instruct", files_of(checkpoint))
    ckpt = resolve_checkpoint("smollm2_135m", None, False)
    assert ckpt.name == "smollm2_135m"
    assert any(path.startswith("/api/models/HuggingFaceTB/SmolLM2-135M-Instruct/")
               for _, path, _ in hub.requests)


# ---------------------------------------------------------------------------------- GGUF

@pytest.fixture(scope="module")
def gguf_file(checkpoint, tmp_path_factory) -> Path:
    from tests.checkpoints.test_gguf_families import write_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_gguf(checkpoint, get_config("llama_tiny"), "llama", path)


def test_one_gguf_by_its_quantization_tag(hub, gguf_file):
    blob = gguf_file.read_bytes()
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": blob, "tiny-Q4_K_S.gguf": b"other",
                              "tiny-Q8_0.gguf": b"other", "mmproj-tiny-Q4_K_M.gguf": b"x",
                              "README.md": b"#"})
    ckpt = resolve_checkpoint(None, "org/tiny-GGUF:Q4_K_M", False)
    assert ckpt.kind == "gguf" and ckpt.name == "tiny-GGUF-Q4_K_M"
    assert [f for f, _ in hub.gets()] == ["tiny-Q4_K_M.gguf"]
    hub.requests.clear()
    assert resolve_checkpoint(None, "org/tiny-GGUF:q4_k_m", False, offline=True).path == ckpt.path
    assert hub.requests == []
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(None, "org/tiny-GGUF:Q4_K", False)
    assert str(e.value) == ("org/tiny-GGUF has no .gguf file named with Q4_K; name one as "
                            "org/tiny-GGUF:TAG. Its .gguf files: tiny-Q4_K_M.gguf, "
                            "tiny-Q4_K_S.gguf, tiny-Q8_0.gguf.")
    with pytest.raises(CheckpointError, match=r"org/tiny-GGUF has 3 .gguf files; name one as "
                                              r"org/tiny-GGUF:TAG"):
        resolve_checkpoint(None, "org/tiny-GGUF", False)


def test_picking_a_gguf():
    files = ["a/m-Q8_0.gguf", "b/m-Q8_0.gguf", "m-Q4_0.gguf", "m-IQ4_XS.gguf",
             "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]
    assert pick_gguf(files, HubName("o/m", quant="Q4_0")) == "m-Q4_0.gguf"
    assert pick_gguf(files, HubName("o/m", quant="iq4_xs")) == "m-IQ4_XS.gguf"
    with pytest.raises(CheckpointError, match="has 2 .gguf files named with Q8_0"):
        pick_gguf(files, HubName("o/m", quant="Q8_0"))
    with pytest.raises(CheckpointError, match="one part of a split GGUF"):
        pick_gguf(files, HubName("o/m", quant="Q6_K"))
    with pytest.raises(CheckpointError, match=r"o/m has 1 .gguf file; name one as o/m:TAG. "
                                              r"Its .gguf files: only-Q8_0.gguf.$"):
        pick_gguf(["only-Q8_0.gguf", "README.md"], HubName("o/m"))
