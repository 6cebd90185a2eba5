"""Which vLLM host is installed, and which kind of build it is, read from its installed files.

Never imports vllm: importing it is slow, may initialise CUDA, and would run the very plugin
machinery qpnserve hooks into. Everything here reads files (importlib.metadata for the
distribution, ``ast`` for Python sources, a byte search of the compiled ``_C`` library).

The kind is decided from what is installed, before (and independently of) the distribution's
name (contract section 1):
- ``native``: the compiled ``_C`` library registers the op schema
  ``awq_moe_qpn_m1_sm70_out(Tensor...``; the name alone in Python text is not enough (a build
  may mention the op and still lack it). ReVolta 0.1.4 (distribution ``revolta``) is one;
- ``patched``: ``vllm/model_executor/layers/quantization/awq_sm70_moe.py`` defines
  ``class AWQSM70MoEMethod`` with a method ``_apply_legacy_single_token_compact`` (1Cat-vLLM
  v1.3.0), the hook point of qpnserve's dispatch;
- ``none``: neither (upstream vLLM, or an older SM70 build).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import mmap
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The one definition of a host's kind: the facts, the route reports and the state files use it.
HostKind = Literal["native", "patched", "none"]

ROUTE_FLAG_NAME = "VLLM_SM70_AWQ_QWEN38_QPN_M1"
NATIVE_OP_NAME = "awq_moe_qpn_m1_sm70_out"
# What TORCH_LIBRARY's m.def() leaves in the library: the schema string, arguments included.
NATIVE_OP_SCHEMA = (NATIVE_OP_NAME + "(Tensor").encode()
# The hook point of a patched host, relative to the installed ``vllm`` package directory.
METHOD_MODULE_RELPATH = "model_executor/layers/quantization/awq_sm70_moe.py"
METHOD_MODULE = "vllm.model_executor.layers.quantization.awq_sm70_moe"
METHOD_CLASS = "AWQSM70MoEMethod"
HOOK_METHOD = "_apply_legacy_single_token_compact"


class HostInfo(BaseModel):
    """The one record of the installed host (the importable ``vllm`` package).

    detect_host() reads it from the installed files; the preflight keeps it in its facts (the
    ``host`` object of `check --json` and of a recorded $QPNSERVE_FACTS_FILE, field for field as
    earlier versions wrote it) and adds the patch verdict; `up` decides and records from it."""

    model_config = ConfigDict(frozen=True)

    found: bool  # False: no importable vllm package (every other field is its default)
    dist_name: str | None = None  # normalised distribution name ("revolta", "1cat-vllm", "vllm")
    version: str | None = None  # "unknown" when neither metadata nor vllm/_version.py tells
    kind: HostKind = "none"
    package_dir: Path | None = None  # the installed ``vllm`` package directory
    has_route_flag: bool = False  # envs.py knows VLLM_SM70_AWQ_QWEN38_QPN_M1
    has_native_op: bool = False  # the compiled _C library registers awq_moe_qpn_m1_sm70_out
    has_hook_method: bool = False  # AWQSM70MoEMethod._apply_legacy_single_token_compact exists
    has_sm70_method: bool = False  # class AWQSM70MoEMethod exists at all (an SM70 build)
    # Patched hosts, as the preflight judged them: the validated build whose source the installed
    # hook matches ("1cat-vllm 1.3.0"), or why the dispatch patch would refuse this host.
    patch_validated: str | None = None
    patch_error: str | None = None
    # The $QPNSERVE_FACTS_FILE that stood in for the machine when this record came from one
    # (what `up` records and `status` names); not part of the facts' JSON, which has source_file.
    facts_file: str | None = Field(default=None, exclude=True)

    @property
    def label(self) -> str:
        """ "revolta 0.1.4": how every message names the host."""
        return f"{self.dist_name} {self.version}"

    @property
    def installed_dir(self) -> Path:
        """``package_dir`` of a found host (a record without one is a caller's mistake)."""
        if self.package_dir is None:
            raise ValueError("the host record names no installed vllm package directory")
        return self.package_dir


def _normalise_dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_package_dir(search_path: Sequence[str | Path] | None = None) -> Path | None:
    """The directory of the importable ``vllm`` package, found without importing it."""
    if search_path is None:
        # A top-level find_spec runs the import finders (editable installs included) but does
        # not execute vllm/__init__.py.
        spec = importlib.util.find_spec("vllm")
    else:
        spec = importlib.machinery.PathFinder.find_spec("vllm", [str(p) for p in search_path])
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if Path(location, "__init__.py").is_file():
            return Path(location).resolve()
    return None


def _top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    # What packages_distributions() reads (top_level.txt, else the first part of each file),
    # for one distribution, so that a test's search path is honoured too.
    listed = (dist.read_text("top_level.txt") or "").split()
    if listed:
        return set(listed)
    return {str(f).replace("\\", "/").split("/")[0].removesuffix(".py") for f in dist.files or []}


def _dist_for(package_dir: Path, search_path: Sequence[str | Path] | None) -> tuple[str, str]:
    """(normalised name, version) of the distribution that installed the ``vllm`` package:
    whichever name it has (revolta, 1cat-vllm, vllm); the kind never depends on it."""
    if search_path is None:
        dists = importlib.metadata.distributions()
    else:
        dists = importlib.metadata.distributions(path=[str(p) for p in search_path])
    candidates: list[tuple[int, str, str]] = []
    for dist in dists:
        if "vllm" not in _top_level_names(dist):
            continue
        owns = any(
            Path(str(dist.locate_file(f))).resolve().parent == package_dir
            for f in (dist.files or [])
            if str(f).replace("\\", "/").startswith("vllm/__init__.")
        )
        # Two distributions may both claim vllm/ (one installed over the other): the one whose
        # RECORD lists these very files is the one that is imported.
        name = _normalise_dist_name(dist.metadata["Name"] or "")
        candidates.append((0 if owns else 1, name, dist.version or "unknown"))
    if candidates:
        _, name, version = min(candidates)
        return name, version
    return "vllm", _version_from_source(package_dir)


def _version_from_source(package_dir: Path) -> str:
    for rel in ("_version.py", "version.py"):
        tree = _parse(package_dir / rel)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and t.id in ("__version__", "version")
                    for t in node.targets
                )
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    return "unknown"


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def _file_contains(path: Path, needle: bytes) -> bool:
    try:
        with path.open("rb") as f:
            if path.stat().st_size == 0:
                return False
            # mmap: the compiled _C library is hundreds of MB; no need to read it into memory.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return mapped.find(needle) >= 0
    except (OSError, ValueError):
        return False


def _envs_knows_route_flag(package_dir: Path) -> bool:
    return _file_contains(package_dir / "envs.py", ROUTE_FLAG_NAME.encode())


def _native_op_registered(package_dir: Path) -> bool:
    libraries = sorted(package_dir.glob("_C*.so")) + sorted(package_dir.glob("_moe_C*.so"))
    return any(_file_contains(p, NATIVE_OP_SCHEMA) for p in libraries)


def _find_method(
    tree: ast.Module, class_name: str, method_name: str
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    item.name == method_name
                ):
                    return item
    return None


def method_source(
    host_or_package_dir: HostInfo | Path | str,
    module_relpath: str,
    class_name: str,
    method_name: str,
) -> str | None:
    """Exact source text (decorators included) of ``class_name.method_name`` in an installed
    module, or None when the file, class or method is absent or the file does not parse.

    ``module_relpath`` is relative to the ``vllm`` package directory
    ("model_executor/layers/quantization/awq_sm70_moe.py"); a dotted module name
    ("vllm.model_executor.layers.quantization.awq_sm70_moe") is accepted too.
    """
    if isinstance(host_or_package_dir, HostInfo):
        package_dir = host_or_package_dir.installed_dir
    else:
        package_dir = Path(host_or_package_dir)
    if not module_relpath.endswith(".py"):
        parts = module_relpath.split(".")
        if parts and parts[0] == "vllm":
            parts = parts[1:]
        module_relpath = "/".join(parts) + ".py"
    path = package_dir / module_relpath
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    node = _find_method(tree, class_name, method_name)
    if node is None:
        return None
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    last = node.end_lineno or node.lineno
    lines = text.splitlines(keepends=True)
    return "".join(lines[first - 1 : last])


def fingerprint(source: str) -> str:
    """ "sha256:<hex>" of ``source`` normalised so that re-indentation and trailing whitespace
    do not change it: dedent, strip trailing whitespace on every line, drop leading and trailing
    blank lines, join with "\\n"."""
    lines = [line.rstrip() for line in textwrap.dedent(source).splitlines()]
    normalised = "\n".join(lines).strip("\n")
    return "sha256:" + hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def classify(package_dir: Path) -> tuple[HostKind, dict[str, bool]]:
    """The kind of an installed vllm tree, and the file facts it was decided from."""
    tree = _parse(package_dir / METHOD_MODULE_RELPATH)
    has_class = tree is not None and any(
        isinstance(node, ast.ClassDef) and node.name == METHOD_CLASS for node in tree.body
    )
    found = {
        "has_route_flag": _envs_knows_route_flag(package_dir),
        "has_native_op": _native_op_registered(package_dir),
        "has_hook_method": tree is not None
        and _find_method(tree, METHOD_CLASS, HOOK_METHOD) is not None,
        "has_sm70_method": has_class,
    }
    kind: HostKind = "none"
    if found["has_native_op"]:
        kind = "native"
    elif found["has_hook_method"]:
        kind = "patched"
    return kind, found


def detect_host(search_path: Sequence[str | Path] | None = None) -> HostInfo | None:
    """The installed vLLM host, or None when no ``vllm`` package is importable.

    ``search_path`` replaces sys.path (and the import hooks of editable installs) for both the
    package and its distribution metadata; tests point it at a fake or unpacked installed tree.
    """
    package_dir = find_package_dir(search_path)
    if package_dir is None:
        return None
    name, version = _dist_for(package_dir, search_path)
    kind, found = classify(package_dir)
    return HostInfo(
        found=True,
        dist_name=name,
        version=version,
        package_dir=package_dir,
        kind=kind,
        has_route_flag=found["has_route_flag"],
        has_native_op=found["has_native_op"],
        has_hook_method=found["has_hook_method"],
        has_sm70_method=found["has_sm70_method"],
    )
