"""Docs that are generated must match their source."""

from __future__ import annotations

from scripts.gen_config_docs import ROOT, render


def test_configuration_reference_is_in_sync() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == render(), (
        "docs/configuration.md is stale: python -m scripts.gen_config_docs"
    )


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```")
    assert "make run" in blocks[1] and "make test" in blocks[1]
