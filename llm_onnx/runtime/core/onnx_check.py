"""Refuse ONNX files whose external data would be read from outside their model folder.

An ONNX initializer can name any file as its external data (``../../home/user/.ssh/id_rsa``, an
absolute path, a symlink out of the folder). Before ONNX Runtime opens a graph, every tensor's
``location`` is checked to resolve inside the model folder. The runtime does not depend on the
``onnx`` package, so this reads the protobuf wire format directly, following only the fields that
can hold tensors: graph initializers and sparse initializers, node attributes (tensors and
subgraphs) and model-local functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from llm_onnx.errors import ModelFolderError

# field numbers in onnx.proto
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE = 1, 5, 15
_NODE_ATTRIBUTE = 5
_FUNCTION_NODE = 7
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS, _ATTR_SPARSE, _ATTR_SPARSES = 5, 6, 10, 11, 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_EXTERNAL_DATA = 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_MAX_DEPTH = 64  # nested subgraphs; a deeper file is refused rather than recursed into


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview]]:
    """(field number, payload) of each length-delimited field; other wire types are skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated field")
            yield number, buf[pos:pos + length]
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")


def _tensor_locations(tensor: memoryview) -> Iterator[str]:
    for number, payload in _fields(tensor):
        if number == _TENSOR_EXTERNAL_DATA:
            entry = dict(_fields(payload))
            key = entry.get(_ENTRY_KEY)
            if key is not None and bytes(key) == b"location" and entry.get(_ENTRY_VALUE) is not None:
                yield bytes(entry[_ENTRY_VALUE]).decode("utf-8", "replace")


def _sparse_locations(sparse: memoryview) -> Iterator[str]:
    for number, payload in _fields(sparse):
        if number in (_SPARSE_VALUES, _SPARSE_INDICES):
            yield from _tensor_locations(payload)


def _node_locations(node: memoryview, depth: int) -> Iterator[str]:
    for number, attribute in _fields(node):
        if number != _NODE_ATTRIBUTE:
            continue
        for field, payload in _fields(attribute):
            if field in (_ATTR_T, _ATTR_TENSORS):
                yield from _tensor_locations(payload)
            elif field in (_ATTR_SPARSE, _ATTR_SPARSES):
                yield from _sparse_locations(payload)
            elif field in (_ATTR_G, _ATTR_GRAPHS):
                yield from _graph_locations(payload, depth + 1)


def _graph_locations(graph: memoryview, depth: int = 0) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        raise ValueError("subgraphs nested too deeply")
    for number, payload in _fields(graph):
        if number == _GRAPH_INITIALIZER:
            yield from _tensor_locations(payload)
        elif number == _GRAPH_SPARSE:
            yield from _sparse_locations(payload)
        elif number == _GRAPH_NODE:
            yield from _node_locations(payload, depth)


def external_data_locations(model_bytes: bytes) -> list[str]:
    """Every external-data ``location`` an ONNX model file refers to."""
    out: list[str] = []
    for number, payload in _fields(memoryview(model_bytes)):
        if number == _MODEL_GRAPH:
            out += _graph_locations(payload)
        elif number == _MODEL_FUNCTIONS:
            for field, node in _fields(payload):
                if field == _FUNCTION_NODE:
                    out += _node_locations(node, 0)
    return out


def check_external_data(onnx_file: Path) -> None:
    """ModelFolderError unless every external-data file of ``onnx_file`` is a regular file inside
    its folder (after resolving symlinks)."""
    folder = onnx_file.parent.resolve()
    try:
        locations = set(external_data_locations(onnx_file.read_bytes()))
    except ValueError as e:
        raise ModelFolderError(f"{onnx_file}: not a readable ONNX file ({e}).") from None
    for location in sorted(locations):
        rel = Path(location)
        target = (folder / rel).resolve()
        if rel.is_absolute() or ".." in rel.parts or not target.is_relative_to(folder):
            raise ModelFolderError(f"{onnx_file}: external data location {location!r} points "
                                   "outside the model folder; refusing to load it.")
        if not target.is_file():
            raise ModelFolderError(f"{onnx_file}: external data file {location!r} is missing.")
