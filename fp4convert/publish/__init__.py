"""Publish converted checkpoints to the Hugging Face Hub, with a model card generated from the manifest.

Modules, one job each: ``card`` renders the README.md from the manifest; ``prepare`` verifies the
output and decides offline what to upload; ``remote`` reads the repo and plans the one commit;
``upload`` confirms, uploads, commits and checks. :func:`prepare_publication` and :func:`publish`
are the API; ``fp4convert publish`` is the CLI over them. Fetching Hub *sources* is
:mod:`fp4convert.hub`, far below (the converter uses it).

Example (not run: it verifies a converted checkpoint and writes to the Hub):
    >>> from fp4convert.publish import prepare_publication, publish
    >>> pub = prepare_publication("out", "me/Qwen3-30B-A3B-NVFP4")  # doctest: +SKIP
    >>> publish(pub).commit  # doctest: +SKIP
    '3f1c...'
"""

from fp4convert.publish.card import base_model_of, render_card
from fp4convert.publish.prepare import CARD_NAME, LocalFile, Publication, prepare_publication
from fp4convert.publish.remote import PublishPlan, RemoteFile
from fp4convert.publish.upload import PublishResult, publish

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
