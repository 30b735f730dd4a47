"""Publish converted checkpoints to the Hugging Face Hub, with a model card generated from the manifest.

``card`` renders the README.md; ``upload`` verifies, plans, confirms and commits. See
:func:`prepare_publication` and :func:`publish`; ``fp4convert publish`` is the CLI over them.

Example:
    >>> from fp4convert.publish import prepare_publication, publish
    >>> pub = prepare_publication("out", "me/Qwen3-30B-A3B-NVFP4")  # doctest: +SKIP
    >>> publish(pub).commit  # doctest: +SKIP
    '3f1c...'
"""

from fp4convert.publish.card import base_model_of, render_card
from fp4convert.publish.upload import (
    CARD_NAME,
    LocalFile,
    Publication,
    PublishPlan,
    PublishResult,
    RemoteFile,
    prepare_publication,
    publish,
)

__all__ = [
    "CARD_NAME",
    "LocalFile",
    "Publication",
    "PublishPlan",
    "PublishResult",
    "RemoteFile",
    "base_model_of",
    "prepare_publication",
    "publish",
    "render_card",
]
