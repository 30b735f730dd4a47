"""Source formats: how a checkpoint stores its tensors, and the one way each is decoded (docs/sources.md).

* :mod:`~fp4convert.checkpoint.decode.declared`: what config.json's ``quantization_config``
  declares (plain, FP8 block-scaled with optional UE8M0 scales, compressed-tensors FP8 per
  channel, MXFP4), refusing anything else.
* :mod:`~fp4convert.checkpoint.decode.dequant`: the dequantizers (DeepSeek's FP8 reference cast,
  compressed-tensors' per-channel FP8 cast, exact MXFP4) and the scale checks, each defined once.
* :mod:`~fp4convert.checkpoint.decode.fused`: fused 3-D expert layouts and their exact split.
* :mod:`~fp4convert.checkpoint.decode.units`: what a logical view is made of (byte ranges, read
  units, logical tensors, the view and its inventory).
* :mod:`~fp4convert.checkpoint.decode.view`: building the logical view of a checkpoint from its
  headers: every model tensor under its per-tensor name, its source format, bytes, and read unit.
* :mod:`~fp4convert.checkpoint.decode.read`: reading logical tensors through any byte-range
  reader, a mapping over a source, and the up-front scale check.
"""

from fp4convert.checkpoint.decode.declared import SourceQuantization, source_quantization
from fp4convert.checkpoint.decode.dequant import DEQUANTIZERS, dequantize_fp8_block, dequantize_mxfp4
from fp4convert.checkpoint.decode.read import DecodedSource, SourceDecoder, check_scales
from fp4convert.checkpoint.decode.units import LogicalTensor, SourceView
from fp4convert.checkpoint.decode.view import source_view

__all__ = [
    "DEQUANTIZERS",
    "DecodedSource",
    "LogicalTensor",
    "SourceDecoder",
    "SourceQuantization",
    "SourceView",
    "check_scales",
    "dequantize_fp8_block",
    "dequantize_mxfp4",
    "source_quantization",
    "source_view",
]
