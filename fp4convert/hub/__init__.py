"""The Hugging Face Hub as a source: fetch a checkpoint or a config, and turn client errors into ``HubError``.

Two modules, one job each: :mod:`~fp4convert.hub.sources` fetches source snapshots and configs
(safetensors only, never pickles), :mod:`~fp4convert.hub.errors` maps huggingface_hub's exceptions
to one :class:`~fp4convert.errors.HubError` with a hint, never letting a token through. This
package imports only the leaves of the layer order (errors, version), so the converter, the
verifier and the Megatron import can fetch sources; publishing a converted checkpoint sits far
above them, in :mod:`fp4convert.publish`.

Example:
    >>> is_repo_id("Qwen/Qwen3-30B-A3B"), is_repo_id("./out")
    (True, False)
"""

from __future__ import annotations

from fp4convert.hub.errors import http_cause, hub_error, redact
from fp4convert.hub.sources import (
    ENDPOINT_ENV,
    SOURCE_ALLOW_PATTERNS,
    hub_endpoint,
    is_repo_id,
    resolve_model_config,
    resolve_source,
)

__all__ = [
    "ENDPOINT_ENV",
    "SOURCE_ALLOW_PATTERNS",
    "http_cause",
    "hub_endpoint",
    "hub_error",
    "is_repo_id",
    "redact",
    "resolve_model_config",
    "resolve_source",
]
