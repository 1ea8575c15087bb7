"""Move a random-weights model folder to a machine in a few MiB: everything but its large weights.

A full-size random-weights export (qwen3_8b: 16 GB at fp16) is random numbers around a few MiB
of graphs, tokenizer and small tensors. ``pack`` keeps the folder's files except weights.data,
and from weights.data only the float tensors up to --keep-bytes (norms, RoPE tables, ...), with a table
of every tensor's place and type. ``unpack`` writes weights.data again: the kept tensors as they
were, every other one filled with fresh random values of its type (float: N(0, 0.02), bytes:
uniform), then puts the new file's size and sha256 in the manifest. The graphs are the exporter's
own; the timing of a model run does not depend on the values of its weights. Speed and memory
figures only: the filled folder computes nothing meaningful.

    python -m benchmarks.tools.refill_weights pack /tmp/m/qwen3_8b-fp16 q8b-fp16.tar.xz
    python -m benchmarks.tools.refill_weights unpack q8b-fp16.tar.xz /tmp/m  # -> /tmp/m/qwen3_8b-fp16
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

WEIGHTS = "weights.data"
TABLE = "refill.json"
KEPT = "refill-kept.bin"
BLOCK = 64 << 20
UINT8 = 2  # onnx.TensorProto.UINT8  # bytes of random values written at a time


def tensor_table(folder: Path) -> list[dict]:
    """Every initializer stored in weights.data by any graph of the folder: offset, length,
    ONNX data type, name (one entry per offset)."""
    import onnx

    seen: dict[int, dict] = {}
    for graph in sorted(folder.glob("*.onnx")):
        model = onnx.load(str(graph), load_external_data=False)
        for t in model.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in t.external_data}
            if info.get("location") != WEIGHTS:
                continue
            offset = int(info.get("offset", 0))
            seen.setdefault(offset, {"offset": offset, "length": int(info["length"]),
                                     "type": int(t.data_type), "name": t.name})
    return [seen[k] for k in sorted(seen)]


def pack(folder: Path, out: Path, keep_bytes: int, keep_quantized: bool = False) -> None:
    table = tensor_table(folder)
    kept = io.BytesIO()
    with open(folder / WEIGHTS, "rb") as f:
        for entry in table:
            # packed 4-bit weights and zero points (uint8) are refilled whatever their size
            entry["kept"] = entry["length"] <= keep_bytes and (keep_quantized
                                                                or entry["type"] != UINT8)
            if entry["kept"]:
                f.seek(entry["offset"])
                kept.write(f.read(entry["length"]))
    meta = {"weights_bytes": (folder / WEIGHTS).stat().st_size, "tensors": table}
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w:xz") as tar:
        for path in sorted(folder.iterdir()):
            if path.name != WEIGHTS and path.is_file():
                tar.add(path, arcname=f"{folder.name}/{path.name}")
        for name, data in ((TABLE, json.dumps(meta).encode()), (KEPT, kept.getvalue())):
            info = tarfile.TarInfo(f"{folder.name}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB ({len(table)} tensors, "
          f"{sum(e['kept'] for e in table)} kept, {kept.tell() / 2**20:.1f} MiB of them)")


def _random_block(onnx_type: int, rng: np.random.Generator) -> bytes:
    from onnx import helper

    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))
    count = BLOCK // dtype.itemsize
    if dtype.kind == "f":
        return (0.02 * rng.standard_normal(count, dtype=np.float32)).astype(dtype).tobytes()
    return rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes()


def unpack(archive: Path, dest: Path) -> Path:
    start = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        names = tar.getnames()
        tar.extractall(dest, filter="data")
    folder = dest / names[0].split("/")[0]
    meta = json.loads((folder / TABLE).read_text())
    kept = (folder / KEPT).read_bytes()
    rng = np.random.default_rng(0)
    blocks: dict[int, bytes] = {}
    sha = hashlib.sha256()
    position = kept_at = 0
    tmp = folder / (WEIGHTS + ".partial")
    with open(tmp, "wb") as f:
        def write(data: bytes | memoryview) -> None:
            nonlocal position
            f.write(data)
            sha.update(data)
            position += len(data)

        for entry in meta["tensors"]:
            if entry["offset"] > position:
                write(bytes(entry["offset"] - position))  # alignment padding
            if entry["kept"]:
                write(kept[kept_at:kept_at + entry["length"]])
                kept_at += entry["length"]
                continue
            block = blocks.get(entry["type"])
            if block is None:
                block = blocks[entry["type"]] = _random_block(entry["type"], rng)
            left, shift = entry["length"], int(rng.integers(0, 4096)) * 16
            while left:
                piece = memoryview(block)[shift:shift + min(left, BLOCK - shift)]
                write(piece)
                left -= len(piece)
                shift = 0
        if meta["weights_bytes"] > position:
            write(bytes(meta["weights_bytes"] - position))
    tmp.replace(folder / WEIGHTS)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][WEIGHTS] = {"bytes": position, "sha256": sha.hexdigest()}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    (folder / TABLE).unlink()
    (folder / KEPT).unlink()
    print(f"{folder}: {position / 1e9:.1f} GB of weights written in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="folder -> archive without the large weights")
    p.add_argument("folder", type=Path)
    p.add_argument("archive", type=Path)
    p.add_argument("--keep-bytes", type=int, default=1 << 19,
                   help="float tensors up to this size are kept as they are (default 512 KiB: RoPE "
                        "tables, norms)")
    p.add_argument("--keep-quantized", action="store_true",
                   help="keep uint8 tensors (packed weights, zero points) up to --keep-bytes too")
    u = sub.add_parser("unpack", help="archive -> folder with freshly filled weights")
    u.add_argument("archive", type=Path)
    u.add_argument("dest", type=Path)
    args = ap.parse_args()
    if args.command == "pack":
        pack(args.folder, args.archive, args.keep_bytes, args.keep_quantized)
    else:
        unpack(args.archive, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
