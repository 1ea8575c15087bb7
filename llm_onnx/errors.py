"""Errors the library raises for bad input. The CLI prints them as one line (exit code 1).

Each message says what failed, what is supported and what to do next. These classes import nothing,
so the runtime can raise them without pulling in torch.
"""


class LlmOnnxError(Exception):
    """Base class of the errors meant for users (the CLI shows their message without a traceback)."""


class ConfigError(LlmOnnxError):
    """An unknown preset, or a config.json / option the decoder does not support."""


class CheckpointError(LlmOnnxError):
    """A checkpoint that is missing, truncated, corrupt or does not match its config."""


class ExportError(LlmOnnxError):
    """Export could not produce a model folder (bad output path, disk full, unsupported option)."""


class ParityError(ExportError):
    """The exported ONNX graphs do not compute what the torch decoder computes."""


class ModelFolderError(LlmOnnxError):
    """A model folder the runtime refuses: missing files, unknown format version, bad checksums."""


class GenerationError(LlmOnnxError):
    """Bad generation input: empty prompt, prompt longer than the context, bad sampling options."""


class ProviderError(LlmOnnxError):
    """An execution provider that was asked for but cannot run here."""


class MediaError(GenerationError):
    """An image (or other media) the runtime refuses: unreadable, truncated, too large, of an
    unsupported format or shape. Names the part it came from."""


class KernelsError(LlmOnnxError):
    """llm-onnx's own operator library cannot be built or loaded (no headers, no compiler, a
    failed build, a library older than the folder needs)."""
