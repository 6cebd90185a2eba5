"""Print the manifest's fingerprints and signatures for a host source, as TOML to paste.

Usage (either an installed host, or one source file, e.g. taken from a git tag):
    python tools/fingerprint_host.py --package-dir /path/to/site-packages/vllm
    git -C <1Cat-vLLM clone> show v1.3.0:vllm/model_executor/layers/quantization/awq_sm70_moe.py \
        > /tmp/awq_sm70_moe.py && python tools/fingerprint_host.py --source /tmp/awq_sm70_moe.py

Fingerprints come from qpnserve.host (method_source + fingerprint), the very functions the plugin
uses on the installed files at startup, so what this prints is what the plugin will compare.
Nothing here imports vllm.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
import tempfile
from pathlib import Path

from qpnserve.dispatch.manifest import load_manifest
from qpnserve.host import fingerprint, method_source


def _signature(source: str) -> list[str]:
    import textwrap

    func = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
    args = func.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--package-dir", type=Path, help="an installed vllm package directory")
    group.add_argument("--source", type=Path, help="the host module's source file alone")
    args = parser.parse_args(argv)

    target = load_manifest().target
    with tempfile.TemporaryDirectory() as tmp:
        package_dir = args.package_dir
        if args.source is not None:
            package_dir = Path(tmp) / "vllm"
            (package_dir / target.module_path).parent.mkdir(parents=True)
            shutil.copyfile(args.source, package_dir / target.module_path)
        sources = {
            name: method_source(package_dir, target.module_path, target.class_name, name)
            for name in target.fingerprinted
        }
    missing = [name for name, src in sources.items() if src is None]
    if missing:
        print(f"error: {target.class_name} lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    print("[validated.fingerprints]")
    for name, src in sources.items():
        print(f'{name} = "{fingerprint(src or "")}"')
    print("\n[target.signatures]")
    for name in target.wrapped:
        params = ", ".join(f'"{p}"' for p in _signature(sources[name] or ""))
        print(f"{name} = [{params}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
