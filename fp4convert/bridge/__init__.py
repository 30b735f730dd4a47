"""The Megatron side: live weight export under a contract, import into Megatron, and proof that an
export followed the contract.

* :func:`export_hf`: Megatron-Core BF16 tensors -> the HF tensors of a dialect, quantized per contract
  (what a sampler receives at a live weight update).
* :func:`import_hf`: an HF checkpoint -> Megatron-named BF16 safetensors plus the TransformerEngine
  precision file of the contract.
* :func:`validate_export`: an export compared byte for byte with the reference quantizer applied to
  the BF16 master, with a per-tensor report and the likely cause of each difference.
"""

from __future__ import annotations

from fp4convert.bridge.export import export_hf

__all__ = ["export_hf"]
