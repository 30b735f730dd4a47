"""The converter: ``convert`` (:mod:`~fp4convert.convert.execute`) and ``dequantize``.

:mod:`~fp4convert.convert.execute` runs a conversion's phases, :mod:`~fp4convert.convert.shards`
streams each output shard, :mod:`~fp4convert.convert.output` writes the other files and
:mod:`~fp4convert.convert.manifest` what the manifest records; :mod:`~fp4convert.convert.dequantize`
turns any dialect back into BF16, and :mod:`~fp4convert.convert.decoded` an FP8 / MXFP4 / fused
source into its per-tensor BF16 master.
"""
