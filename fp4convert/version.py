"""The fp4convert version: one definition, read by the package, manifests, shard metadata and the CLI.

A leaf module (it imports nothing of fp4convert), so any layer may import it.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
