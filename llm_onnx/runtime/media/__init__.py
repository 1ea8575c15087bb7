"""Media in: images decoded, preprocessed for a family's vision encoder and placed in the
prompt, with numpy and Pillow only (no torch). Room for audio beside them later.

    image = load_image("photo.jpg")                  # RGBImage: (H, W, 3) uint8 + digest
    processor = load_image_processor(checkpoint)     # from preprocessor_config.json
    processed = processor(image)                     # ProcessedImage: pixel_values, num_tokens
    layout = processor.token_layout(encode)          # the family's image block in the prompt
    prompt = expand_image_tokens(ids, [processed], layout)  # ids, spans, position rows

Modules: image.py (decoding, safely), pixels.py (the output type, resize, rescale/normalise),
qwen_vl.py, gemma3.py, gemma4.py (one family each: resize rule, patches, tokens, prompt
block), fields.py and config.py (reading the processor's config), prompt.py (placeholders to
soft tokens, spans and multimodal RoPE positions). Each processor computes what transformers'
PIL image processor computes, to the pixel (tests/runtime/media check it).
"""

from llm_onnx.errors import MediaError
from llm_onnx.runtime.media.config import (
                                           ImageProcessor,
                                           image_processor_from_dict,
                                           load_image_processor,
)
from llm_onnx.runtime.media.gemma3 import Gemma3ImageProcessor
from llm_onnx.runtime.media.gemma4 import Gemma4ImageProcessor
from llm_onnx.runtime.media.image import RGBImage, load_image
from llm_onnx.runtime.media.pixels import ProcessedImage
from llm_onnx.runtime.media.prompt import (
                                           ImagePrompt,
                                           ImageTokenLayout,
                                           ImageTokens,
                                           expand_image_text,
                                           expand_image_tokens,
                                           find_image_spans,
                                           mrope_positions,
)
from llm_onnx.runtime.media.qwen_vl import QwenVLImageProcessor

__all__ = ["Gemma3ImageProcessor", "Gemma4ImageProcessor", "ImageProcessor", "ImagePrompt",
           "ImageTokenLayout", "ImageTokens", "MediaError", "ProcessedImage",
           "QwenVLImageProcessor", "RGBImage", "expand_image_text", "expand_image_tokens",
           "find_image_spans", "image_processor_from_dict", "load_image", "load_image_processor",
           "mrope_positions"]
