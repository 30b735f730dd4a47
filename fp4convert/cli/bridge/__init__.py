"""``fp4convert bridge to-megatron|validate-export``: the Megatron side (fp4convert.bridge)."""

from __future__ import annotations

import click

from fp4convert.cli.bridge.to_megatron import to_megatron
from fp4convert.cli.bridge.validate_export import validate_export

__all__ = ["bridge"]


@click.group()
def bridge() -> None:
    """Megatron side: HF checkpoints into Megatron, and proof that a live weight export followed the contract."""


bridge.add_command(to_megatron)
bridge.add_command(validate_export)
