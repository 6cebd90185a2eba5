"""Every command line of the lifecycle blocks of README.md and docs/commands.md works as written
on a fresh install (no desired state, no $QPNSERVE_MODEL): each runs here, `up` as a dry run so
nothing starts, with optional flags (`[--json]`) given and the documents' model path pointing at
a synthetic checkpoint."""

from __future__ import annotations

import shlex

import pytest

from qpnserve import config
from tests.lifecycle.conftest import REPO_ROOT, Env, cli

DOC_MODELS = ("/models/Qwen3.8-AWQ", "~/models/Qwen3.8-AWQ")


def _blocks() -> dict[str, str]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("<!-- SECTION:lifecycle -->")[1].split("<!-- /SECTION:lifecycle -->")[0]
    commands_md = (REPO_ROOT / "docs" / "commands.md").read_text()
    server = commands_md.split("`up`, `status`, `down` and `rollback`.", 1)[1]
    return {
        "README.md": section.split("```bash\n", 1)[1].split("```", 1)[0],
        "docs/commands.md": server.split("```bash\n", 1)[1].split("```", 1)[0],
    }


def lifecycle_commands(doc: str | None = None) -> list[list[str]]:
    blocks = _blocks()
    return [c for name in ([doc] if doc else blocks) for c in _commands(blocks[name])]


def _commands(block: str) -> list[list[str]]:
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "qpnserve", line
        commands.append([w.strip("[]") for w in words[1:]])  # `[--json]`: give the option
    return commands


@pytest.mark.parametrize("doc", ["README.md", "docs/commands.md"])
def test_lifecycle_block_has_the_commands_it_describes(doc: str) -> None:
    names = [c[0] for c in lifecycle_commands(doc)]
    assert names == ["up", "up", "up", "status", "rollback", "down"]


@pytest.mark.parametrize("args", lifecycle_commands(), ids=shlex.join)
def test_readme_lifecycle_command_works_on_a_fresh_install(
    env: Env, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.delenv(config.MODEL.name)  # a fresh install: nothing names the model
    args = [str(env.model) if a in DOC_MODELS else a for a in args]
    if args[0] == "up" and "--dry-run" not in args:
        args.insert(1, "--dry-run")  # checks as `up` does, starts nothing
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert not env.server_json.exists()
