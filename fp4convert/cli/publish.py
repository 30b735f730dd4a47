"""``fp4convert publish DST REPO_ID``: verify, then upload a converted checkpoint in one commit."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json
from fp4convert.plan import human_bytes
from fp4convert.publish import Publication, PublishPlan, prepare_publication
from fp4convert.publish import publish as publish_checkpoint


def _progress(enabled: bool) -> Any:
    """Progress lines on stderr (stdout carries only the result)."""

    def hook(event: str, payload: Mapping[str, Any]) -> None:
        if not enabled:
            return
        match event:
            case "inspect":
                where = payload["endpoint"] or "huggingface.co"
                click.echo(f"reading {payload['repo_id']}@{payload['revision']} on {where}", err=True)
            case "create_repo":
                click.echo(f"creating {payload['repo_id']}{' (private)' if payload['private'] else ''}", err=True)
            case "create_branch":
                click.echo(f"creating the branch {payload['branch']} from main", err=True)
            case "upload" if payload["files"]:
                click.echo(
                    f"uploaded {payload['files']}/{payload['of']} files "
                    f"({human_bytes(payload['bytes'])} of {human_bytes(payload['total'])})",
                    err=True,
                )
            case "commit":
                click.echo(f"committing {payload['files']} files, deleting {payload['delete']}", err=True)
            case "check":
                click.echo(f"checking the remote files of {payload['commit'][:12]} against the folder", err=True)

    return hook


def _render_dry_run(pub: Publication) -> None:
    width = max(len(f"{f.size:,}") for f in pub.files)
    click.echo(
        f"would publish {len(pub.files)} files ({human_bytes(pub.total_bytes)}) "
        f"to {pub.repo_id}@{pub.revision}{' (private)' if pub.private else ''}; {pub.verification}"
    )
    for f in pub.files:
        generated = "  (generated model card)" if f.content is not None else ""
        click.echo(f"  {f.size:>{width},}  {f.path}{generated}")
    click.echo("\n--- README.md (the generated model card) ---")
    click.echo(pub.card, nl=False)


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("repo_id")
@click.option("--private", is_flag=True, help="Create the repo private; an existing public repo is refused.")
@click.option(
    "--revision",
    default="main",
    show_default=True,
    help="Branch to commit to; created from main when missing.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="When the repo/branch holds other content, make it equal to DIRECTORY in the one commit "
    "(deleting the files DIRECTORY lacks) instead of refusing.",
)
@click.option(
    "--source",
    default=None,
    help="BF16 source (folder or repo id): re-derive every byte before publishing (the card says so).",
)
@click.option("--base-model", default=None, help="The card's base_model when the source was a local folder.")
@click.option("--dry-run", is_flag=True, help="List every file with its size and print the card; no network access.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before changing the remote repo.")
@options.device
@options.quiet
@options.json_output
def publish(
    directory: Path,
    repo_id: str,
    private: bool,
    revision: str,
    replace: bool,
    source: str | None,
    base_model: str | None,
    dry_run: bool,
    yes: bool,
    device: str,
    quiet: bool,
    as_json: bool,
) -> None:
    """Publish the converted checkpoint DIRECTORY to the Hub repo REPO_ID in one commit.

    Refuses an output that does not verify. Creates the repo (and branch) if needed, writes a model
    card (README.md) generated from the manifest, and checks the remote files against DIRECTORY
    after the commit. Asks before changing anything unless --yes. The token comes from HF_TOKEN or
    the saved `hf auth login`; the endpoint from HF_ENDPOINT.
    """
    pub = prepare_publication(
        directory,
        repo_id,
        revision=revision,
        private=private,
        source=source,
        base_model=base_model,
        device=device,
    )
    if dry_run:
        if as_json:
            echo_json(pub)
        else:
            _render_dry_run(pub)
        return
    if quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    def confirm(plan: PublishPlan) -> bool:
        if not (yes and quiet):
            click.echo(plan.describe(), err=True)
        return yes or click.confirm("Proceed?", err=True, abort=True)

    result = publish_checkpoint(pub, replace=replace, confirm=confirm, progress=_progress(not quiet))
    if as_json:
        echo_json(result)
    elif result.status == "unchanged":
        click.echo(
            f"{repo_id}@{revision} already holds exactly {directory} (commit {result.commit[:12]}): nothing to publish"
        )
    else:
        click.echo(
            f"published {len(result.uploaded)} files ({human_bytes(result.uploaded_bytes)}) to "
            f"{repo_id}@{revision} in commit {result.commit[:12]}, remote files checked: {result.url}"
        )
