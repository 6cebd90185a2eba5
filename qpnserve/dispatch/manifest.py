"""The patch manifest (patches/awq_m1_dispatch.toml) and the drift check against the installed host.

The manifest names the host class and methods the patch wraps, the methods it relies on without
wrapping, their parameter lists, and the host builds it was validated against, each with a
fingerprint of every such method's source. The fingerprints are computed from the installed
files (qpnserve.host.method_source + fingerprint), never by importing vllm, so a drifted host is
refused before any of its code runs under the patch.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpnserve.errors import DispatchError

MANIFEST_NAME = "awq_m1_dispatch.toml"


class Target(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    distribution: str  # the host distribution name, e.g. "1cat-vllm"
    module: str  # dotted import path of the host module
    module_path: str  # the same module as a path relative to the installed vllm package dir
    class_name: str = Field(alias="class")
    wrapped: list[str]  # methods the patch wraps
    relied_on: list[str]  # methods not wrapped whose behaviour the patch depends on
    signatures: dict[str, list[str]]  # parameter names of each wrapped method, in order

    @property
    def fingerprinted(self) -> list[str]:
        return [*self.wrapped, *self.relied_on]


class ValidatedBuild(BaseModel):
    model_config = ConfigDict(extra="forbid")

    distribution: str
    version: str
    source: str  # where the fingerprinted source came from (tag, commit)
    obtained_by: str  # the command that computed the fingerprints
    fingerprints: dict[str, str]  # method name -> "sha256:<hex>"


class PatchManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    schema_version: int
    target: Target
    why: str
    how: str
    upstream: str
    remove_when: str
    never_touches: str
    validated: list[ValidatedBuild] = []


def manifest_path() -> Path:
    from qpnserve.resources import resource_dir

    return resource_dir("patches") / MANIFEST_NAME


def load_manifest(path: Path | None = None) -> PatchManifest:
    """Parse and validate the manifest; a broken manifest is a DispatchError, not a traceback."""
    path = path or manifest_path()
    try:
        data = tomllib.loads(path.read_text("utf-8"))
        manifest = PatchManifest.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise DispatchError(
            f"the patch manifest {path.name} is invalid: {where}: {error['msg']}",
            hint="reinstall qpnserve; the manifest ships inside the package",
        ) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        first = str(exc).splitlines()[0]
        raise DispatchError(
            f"the patch manifest {path.name} is unreadable: {first}",
            hint="reinstall qpnserve; the manifest ships inside the package",
        ) from None
    for build in manifest.validated:
        missing = sorted(set(manifest.target.fingerprinted) - set(build.fingerprints))
        if missing:
            raise DispatchError(
                f"the patch manifest {path.name} lists {build.distribution} {build.version} "
                f"without fingerprints for {', '.join(missing)}",
                hint="regenerate them with tools/fingerprint_host.py",
            )
    return manifest


def installed_fingerprints(manifest: PatchManifest, package_dir: Path) -> dict[str, str | None]:
    """Fingerprint each fingerprinted method of the installed host source (None: method absent).

    ``package_dir`` is the installed ``vllm`` package directory (HostInfo.package_dir).
    """
    from qpnserve.host import fingerprint, method_source

    target = manifest.target
    found: dict[str, str | None] = {}
    for name in target.fingerprinted:
        source = method_source(package_dir, target.module_path, target.class_name, name)
        found[name] = None if source is None else fingerprint(source)
    return found


def match_validated_build(
    manifest: PatchManifest,
    version: str,
    installed: dict[str, str | None],
    dist_name: str | None = None,
) -> ValidatedBuild:
    """The validated build whose fingerprints the installed source matches, or DispatchError.

    The installed version's own entry is compared first; a version not listed is accepted only
    when its source is identical (every fingerprint) to some validated build. ``dist_name`` is
    the distribution that owns the installed ``vllm`` (messages name it, not the manifest's).
    """
    target = manifest.target
    where = f"installed {dist_name or target.distribution} {version}"
    for name in target.fingerprinted:
        if installed.get(name) is None:
            raise DispatchError(
                f"{target.class_name}.{name} is missing from {target.module_path} in {where}; "
                "the dispatch patch cannot apply",
                hint="use a validated host build or unset the route flag",
            )
    public = version.split("+", 1)[0]  # "1.3.0+cu128" is release 1.3.0 built for CUDA 12.8
    same_version = [b for b in manifest.validated if b.version.split("+", 1)[0] == public]
    for build in same_version or manifest.validated:
        drifted = [n for n in target.fingerprinted if build.fingerprints[n] != installed[n]]
        if not drifted:
            return build
        if same_version:
            name = drifted[0]
            raise DispatchError(
                f"{target.class_name}.{name} in {where} differs from the source the patch was "
                f"validated against (installed {installed[name]}, validated "
                f"{build.fingerprints[name]}); refusing to patch a drifted host",
                hint="reinstall the validated host build, or set the route flag to 0",
            )
    first = target.fingerprinted[0]
    validated = ", ".join(f"{b.distribution} {b.version}" for b in manifest.validated) or "none"
    differing = next(
        (
            n
            for n in target.fingerprinted
            if all(b.fingerprints[n] != installed[n] for b in manifest.validated)
        ),
        first,
    )
    raise DispatchError(
        f"{where} is not a validated host build and {target.class_name}.{differing} differs "
        f"from every validated build ({validated}); refusing to patch it",
        hint="use a validated host build, or set the route flag to 0",
    )


def verify_installed(
    package_dir: Path,
    version: str,
    manifest: PatchManifest | None = None,
    dist_name: str | None = None,
) -> ValidatedBuild:
    """The drift check the plugin runs, for a preflight: reads files only, never imports vllm.

    Returns the validated build the installed source matches; raises DispatchError naming the
    drifted method and the installed version otherwise.
    """
    manifest = manifest or load_manifest()
    installed = installed_fingerprints(manifest, package_dir)
    return match_validated_build(manifest, version, installed, dist_name)
