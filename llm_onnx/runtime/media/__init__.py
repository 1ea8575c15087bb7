"""Media in: images decoded for the vision encoders, with numpy and Pillow only (no torch).
Room for audio beside them later.

    image = load_image("photo.jpg")                  # RGBImage: (H, W, 3) uint8 + digest

Modules: image.py (decoding, safely).
"""

from llm_onnx.errors import MediaError
from llm_onnx.runtime.media.image import RGBImage, load_image

__all__ = ["MediaError", "RGBImage", "load_image"]
