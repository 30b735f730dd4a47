"""The hub tests' fixtures live in ``hub/fixtures.py`` so that tests/cli can import them too."""

from hub.fixtures import hub, hub_env, source_files  # noqa: F401
