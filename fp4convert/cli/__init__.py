"""The ``fp4convert`` command line: a thin click layer over the library.

Commands parse options, call one library function and render its result; they hold no logic. Each
command lives in its own module, takes its shared options from :mod:`~fp4convert.cli.options` and
writes through :mod:`~fp4convert.cli.render` (one JSON form, one error form). :func:`main` is the
one place a library error becomes the line a user sees.
"""

from __future__ import annotations

import os
import sys

import click

from fp4convert.cli.contract import contract
from fp4convert.cli.convert import convert
from fp4convert.cli.demo import demo
from fp4convert.cli.dequantize import dequantize
from fp4convert.cli.diff import diff
from fp4convert.cli.doctor import doctor
from fp4convert.cli.explain import explain
from fp4convert.cli.golden import golden
from fp4convert.cli.plan import plan
from fp4convert.cli.publish import publish
from fp4convert.cli.render import error_text
from fp4convert.cli.to_megatron import to_megatron
from fp4convert.cli.validate_export import validate_export
from fp4convert.cli.verify import verify
from fp4convert.errors import Fp4ConvertError
from fp4convert.version import __version__

__all__ = ["DEBUG_ENV", "cli", "main"]

DEBUG_ENV = "FP4CONVERT_DEBUG"

# In the order `fp4convert --help` lists them.
_COMMANDS: tuple[click.Command, ...] = (
    demo,
    golden,
    convert,
    verify,
    doctor,
    dequantize,
    contract,
    explain,
    diff,
    plan,
    publish,
    to_megatron,
    validate_export,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fp4convert")
def cli() -> None:
    """Convert checkpoints to NVFP4 / MXFP8 / BF16 under one precision contract, byte-exact.

    Set FP4CONVERT_DEBUG=1 for full tracebacks.
    """


for _command in _COMMANDS:
    cli.add_command(_command)


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
        click.echo(error_text(exc), err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
