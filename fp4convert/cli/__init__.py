"""The ``fp4convert`` command line: a thin click layer over the library.

Commands parse options, call one library function and render its result; they hold no logic.
Each command lives in its own module and is registered in :data:`_COMMANDS` below.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

import click

from fp4convert import __version__
from fp4convert.cli._errors import render_error
from fp4convert.errors import Fp4ConvertError

DEBUG_ENV = "FP4CONVERT_DEBUG"

# (module under fp4convert.cli, attribute): one line per command or command group.
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("demo", "demo"),
    ("golden", "golden"),
    ("convert", "convert"),
    ("verify", "verify"),
    ("dequantize", "dequantize"),
    ("contract", "contract"),
    ("explain", "explain"),
    ("diff", "diff"),
    ("plan", "plan"),
    ("publish", "publish"),
    ("to_megatron", "to_megatron"),
    ("validate_export", "validate_export"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fp4convert")
def cli() -> None:
    """Convert checkpoints to NVFP4 / MXFP8 / BF16 under one precision contract, byte-exact.

    Set FP4CONVERT_DEBUG=1 for full tracebacks.
    """


for _module, _attr in _COMMANDS:
    cli.add_command(getattr(import_module(f"fp4convert.cli.{_module}"), _attr))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning library errors into one readable line on stderr."""
    try:
        # standalone_mode=False hands exit codes back instead of exiting: ctx.exit(n) returns n.
        code = cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Fp4ConvertError as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        click.echo(render_error(exc), err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
