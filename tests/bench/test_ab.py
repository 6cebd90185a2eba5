"""`bench ab` orchestration with injected lifecycle calls: order, restore, failure paths."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qpnserve.bench.ab import AbHooks, AbOptions, run_ab
from qpnserve.bench.models import CanaryResult
from qpnserve.bench.smoke import SmokeOptions, SmokeOutcome
from qpnserve.errors import CanaryError, ConflictError
from qpnserve.lifecycle import UpOptions
from qpnserve.lifecycle.up import desired_from
from tests.bench.test_compare import report


class FakeLifecycle:
    """Records every call; `server` is what a status() would find running (None: nothing)."""

    def __init__(self, found: UpOptions | None, phase: str = "ready") -> None:
        self.calls: list[str] = []
        self.found_desired = desired_from(found) if found else None
        self.server: UpOptions | None = found
        self.phase = phase
        self.restored: list[Any] = []
        self.fail_on: str | None = None

    def status(self) -> Any:
        running = None
        if self.server is not None:
            running = SimpleNamespace(
                pid=4242,
                model=str(self.server.model),
                route_flag="1" if self.server.awq_m1 else "0",
                include_plugin=True,
                tp=self.server.tp,
                host=self.server.host,
                port=self.server.port,
                served_model_name=self.server.served_name,
                extra_args=[],
                server_module=self.server.server_module,
            )
        return SimpleNamespace(
            server=self.phase if running else "not running",
            running=running,
            desired=self.found_desired,
            route_text="4/4 ranks: every MoE layer admitted" if running else None,
        )

    def up(self, opts: UpOptions) -> Any:
        self.calls.append(f"up {'on' if opts.awq_m1 else 'off'}")
        self.server, self.phase = opts, "ready"
        return SimpleNamespace(
            base_url=f"http://127.0.0.1:{opts.port}",
            served_model_name=opts.served_name,
            route_flag="1" if opts.awq_m1 else "0",
        )

    def down(self, timeout_s: float) -> None:
        self.calls.append("down")
        self.server = None

    def smoke(self, opts: SmokeOptions, progress: Any) -> SmokeOutcome:
        self.calls.append(f"smoke {opts.label}")
        result = report(0.25 if opts.label == "route-off" else 0.2)
        result.label = opts.label
        if self.fail_on == opts.label:
            result.canary = CanaryResult(passed=False, checked_streams=1, failures=["x"])
            return SmokeOutcome(result, CanaryError("correctness canary failed: x"))
        return SmokeOutcome(result, None)

    def hooks(self) -> AbHooks:
        return AbHooks(
            status=self.status,
            up=self.up,
            down=self.down,
            smoke=self.smoke,
            restore_desired=self.restored.append,
        )


def options(tmp_path: Path, **up: Any) -> AbOptions:
    prompt_opts = SmokeOptions(
        url="", model=None, prompt=[1, 2], prompt_info=report(1).settings.prompt
    )
    return AbOptions(
        up=UpOptions(model=tmp_path / "ckpt", **up), smoke=prompt_opts, out_dir=tmp_path / "ab"
    )


def test_ab_runs_off_then_on_and_stops_when_nothing_was_running(tmp_path: Path) -> None:
    fake = FakeLifecycle(found=None)
    result = run_ab(options(tmp_path), progress=lambda _: None, hooks=fake.hooks())
    assert fake.calls == ["up off", "smoke route-off", "down", "up on", "smoke route-on", "down"]
    assert fake.server is None and fake.restored == [None]
    pure = result.comparison.cells[0].metrics[0]
    assert pure.metric == "pure_decode_tok_s" and pure.delta_pct == pytest.approx(25.0)
    for name in ("route-off.json", "route-on.json", "compare.json"):
        assert (tmp_path / "ab" / name).is_file()
    assert result.reports["route-on"].server.route is not None


def test_ab_leaves_a_route_on_server_running_as_found(tmp_path: Path) -> None:
    opts = options(tmp_path)
    fake = FakeLifecycle(found=UpOptions(model=tmp_path / "ckpt", awq_m1=True))
    run_ab(opts, progress=lambda _: None, hooks=fake.hooks())
    # The route-on arm IS the found server's configuration: it stays up, no extra restart.
    assert fake.calls == ["down", "up off", "smoke route-off", "down", "up on", "smoke route-on"]
    assert fake.server is not None and fake.server.awq_m1
    assert fake.restored == [fake.found_desired]


def test_ab_restarts_a_route_off_server_as_found(tmp_path: Path) -> None:
    fake = FakeLifecycle(found=UpOptions(model=tmp_path / "ckpt", awq_m1=False, port=8123))
    run_ab(options(tmp_path), progress=lambda _: None, hooks=fake.hooks())
    assert fake.calls[-2:] == ["down", "up off"]
    assert fake.server is not None and not fake.server.awq_m1 and fake.server.port == 8123


def test_ab_canary_failure_puts_the_server_back_and_raises(tmp_path: Path) -> None:
    fake = FakeLifecycle(found=UpOptions(model=tmp_path / "ckpt", awq_m1=False))
    fake.fail_on = "route-on"
    with pytest.raises(CanaryError):
        run_ab(options(tmp_path), progress=lambda _: None, hooks=fake.hooks())
    assert fake.calls[-2:] == ["down", "up off"]  # the found route-off server is back
    assert (tmp_path / "ab" / "route-on.json").is_file()  # the failing arm's report is kept
    assert not (tmp_path / "ab" / "compare.json").exists()


def test_ab_refuses_while_a_server_is_starting(tmp_path: Path) -> None:
    fake = FakeLifecycle(found=UpOptions(model=tmp_path / "ckpt"), phase="starting")
    with pytest.raises(ConflictError, match="is starting"):
        run_ab(options(tmp_path), progress=lambda _: None, hooks=fake.hooks())
    assert fake.calls == []


def test_ab_restore_takes_what_the_desired_state_lacks_from_the_running_server(
    tmp_path: Path,
) -> None:
    found = UpOptions(
        model=tmp_path / "found", awq_m1=False, port=8124, server_module="tests.support.fake_host"
    )
    fake = FakeLifecycle(found=found)
    assert fake.found_desired is not None  # a desired state without a model, module as default
    fake.found_desired = fake.found_desired.model_copy(
        update={"model": None, "server_module": None}
    )
    run_ab(options(tmp_path), progress=lambda _: None, hooks=fake.hooks())
    assert fake.calls[-2:] == ["down", "up off"]
    restored = fake.server
    assert restored is not None and restored.port == 8124
    assert restored.model == str(tmp_path / "found")
    assert restored.server_module == "tests.support.fake_host"
