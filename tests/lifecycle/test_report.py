"""`qpnserve report` against the stand-in server started with a planted API key, a planted
HF_TOKEN and package-index password in the environment, a package whose direct URL carries
credentials, and a server log with a prompt and an unmasked key in it: none of them enters the
archive, and neither the key nor the token is anywhere in the state folder."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.lifecycle.conftest import Env, cli

KEY = "sk-report-planted-key-93c1e"
HF_TOKEN = "hf_ReportPlantedTokenQwErTy42"
PIP_PASSWORD = "pipReportPlanted88"
PROMPT = "the planted prompt about zebras"


def archive_texts(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def files_holding(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.fixture
def planted(env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Env:
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("PIP_INDEX_URL", f"https://user:{PIP_PASSWORD}@index.example/simple")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    info = tmp_path / "site" / "planted_pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-pkg\nVersion: 1.0\n")
    url = f"https://user:{PIP_PASSWORD}@files.example/planted_pkg-1.0-py3-none-any.whl"
    (info / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    done = cli("up", "--no-awq-m1", "--detach", "--", "--api-key", KEY)
    assert done.exit_code == 0, done.stderr
    return env


def test_report_archive_holds_no_planted_secret_and_the_state_folder_neither(
    planted: Env, tmp_path: Path
) -> None:
    out = tmp_path / "bug.tar.gz"
    done = cli("report", "--out", str(out))
    assert done.exit_code == 0, done.stderr
    assert done.stdout.startswith(f"report: {out} (")
    assert "redacted: values of HF_TOKEN; tokens, keys and URL credentials" in done.stdout
    texts = archive_texts(out)
    assert {"check.json", "packages.txt", "server-log-tail.txt", "state/server.json"} <= set(texts)
    assert {"state/desired.json", "route.json", "nvidia-smi-topo.txt", "version.txt"} <= set(texts)
    everything = "\n".join(texts.values())
    for secret in (KEY, HF_TOKEN, PIP_PASSWORD):
        assert secret not in everything
        assert files_holding(planted.state, secret) == []
    assert "planted-pkg @ https://<redacted>@files.example/" in texts["packages.txt"]
    assert '"HF_TOKEN": "<redacted>"' in texts["environment.json"]
    assert json.loads(texts["check.json"])["results"]  # check --json, as `check` prints it
    assert json.loads(texts["state/server.json"])["api_key_set"] is True
    assert out.stat().st_mode & 0o077 == 0


def test_report_leaves_out_prompts_and_an_unmasked_key_the_host_logged(
    planted: Env, tmp_path: Path
) -> None:
    """What ReVolta 0.1.4 logs when the key is an argument, and a request log line."""
    record = json.loads((planted.state / "server.json").read_text())
    with Path(record["log_path"]).open("a") as log:
        log.write(f"INFO non-default args: {{'api_key': ['{KEY}'], 'port': 8000}}\n")
        log.write(f"INFO Received request cmpl-1: prompt: '{PROMPT}', params: ...\n")
        log.write("INFO Avg prompt throughput: 1.0 tokens/s\n")
    done = cli("report", "--out", str(tmp_path / "r.tar.gz"), "--json")
    assert done.exit_code == 0, done.stderr
    result = json.loads(done.stdout)
    tail = archive_texts(Path(result["archive"]))["server-log-tail.txt"]
    assert KEY not in tail and PROMPT not in tail
    assert "non-default args: {'api_key': ['<redacted>'], 'port': 8000}" in tail
    assert "[a line with request content (prompt or completion) removed]" in tail
    assert "Avg prompt throughput: 1.0 tokens/s" in tail  # metrics stay


def test_report_without_any_server_or_state_still_writes_an_archive(
    env: Env, tmp_path: Path
) -> None:
    done = cli("report", "--out", str(tmp_path / "empty.tar.gz"), "--json")
    assert done.exit_code == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["summary"]["server"] == "no server recorded"
    texts = archive_texts(Path(result["archive"]))
    assert texts["server-log-tail.txt"] == "no server log in the state folder\n"
