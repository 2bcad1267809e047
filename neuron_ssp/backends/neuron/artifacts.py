"""Compiled Neuron models kept between runs: one directory per model, holding every compiled k.

`model.save(dir)` writes the compiled networks (NEFFs); a later `model.load(dir)` + `to_neuron()` skips
the compile, but only for the same constructor arguments, the same `enable_speculative_decoder(ks)`
and a compatible compiler. So each directory carries a manifest with exactly those, and is reused
only when the manifest matches. A target compiled with `enable_speculative_decoder([2, ..., 8])`
holds one scoring network per k in ONE directory; the manifest lists the ks and a load asking for a k
outside them is refused. Only where the installed library cannot take a list (see api.py) is each k
its own directory. Weights are not in there: they are read from the checkpoint at every
load, so the model's `config.json` (not its path) identifies it.

A store is a local directory or `s3://bucket/prefix` (synced through a local cache with boto3,
imported only when an S3 store is used).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

MANIFEST = "neuron-ssp-artifact.json"
LOCAL_CACHE = Path(os.environ.get("NEURON_SSP_CACHE", "~/.cache/neuron-ssp")).expanduser() / "compiled"


@dataclass(frozen=True)
class ArtifactSpec:
    """Everything that must be identical for compiled networks to be reused."""

    role: str
    model_name: str
    model_config_sha256: str
    constructor: dict[str, Any]
    speculation_lengths: list[int] | None  # every k compiled into the target; None for the draft
    library_version: str
    one_k_per_model: bool = False  # the library takes one k per model: each k has its own directory

    @property
    def relative_dir(self) -> str:
        c = self.constructor
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", self.model_name) or "model"
        identity = json.dumps([self.model_config_sha256, c], sort_keys=True)
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        if not self.speculation_lengths:
            window = "no-speculation"
        elif self.one_k_per_model:
            window = f"k{self.speculation_lengths[0]}"
        else:
            window = "speculation"  # one directory for the set of k: a new compile replaces it
        dtype, positions = c.get("amp", c.get("torch_dtype")), c.get("n_positions", c.get("seq_len"))  # tnx | NxDI
        return f"{slug}-{dtype}-tp{c['tp_degree']}-npos{positions}-{digest}/{window}"

    def with_lengths(self, speculation_lengths: list[int] | None) -> ArtifactSpec:
        return replace(self, speculation_lengths=speculation_lengths)


def artifact_spec(
    role: str,
    model_dir: Path,
    constructor: dict[str, Any],
    speculation_lengths: list[int] | None,
    library_version: str,
    one_k_per_model: bool = False,
) -> ArtifactSpec:
    config_bytes = (model_dir / "config.json").read_bytes()
    return ArtifactSpec(
        role,
        model_dir.name,
        hashlib.sha256(config_bytes).hexdigest(),
        dict(constructor),
        sorted(speculation_lengths) if speculation_lengths else None,
        library_version,
        one_k_per_model,
    )


class ArtifactStore:
    """Find, stage and publish compiled-model directories under one location."""

    def __init__(self, location: str):
        self.location = location
        self.remote = location.startswith("s3://")
        self.root = LOCAL_CACHE / location.removeprefix("s3://") if self.remote else Path(location).expanduser()

    def describe(self, spec: ArtifactSpec) -> str:
        return f"{self.location.rstrip('/')}/{spec.relative_dir}"

    def find(self, spec: ArtifactSpec) -> Path | None:
        """A local directory ready for `model.load()` holding every k of `spec`, or None."""
        local = self.staging_dir(spec)
        if self.remote and not _matches(local, spec, quiet=True):
            bucket, prefix = _split_s3(self.describe(spec))
            _download(bucket, prefix, local)
        return local if _matches(local, spec) else None

    def find_for_window(self, spec: ArtifactSpec, k: int) -> tuple[Path, list[int]] | None:
        """The compiled target that holds window k: (directory, every k compiled into it), or None.

        Raises a UsageError when a target was compiled with these settings but without k, so a load
        never silently compiles a 70B model again because of a k that `compile --k` did not cover.
        """
        probe = spec.with_lengths([k])
        local = self.staging_dir(probe)
        if self.remote and not _manifest(local):
            bucket, prefix = _split_s3(self.describe(probe))
            _download(bucket, prefix, local)
        saved = _manifest(local)
        if saved is None:
            return None
        compiled = saved.get("speculation_lengths") or []
        if not _matches(local, spec.with_lengths(compiled)):
            return None
        if k not in compiled:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"the target in {self.describe(probe)} was compiled for k in {compiled}, not {k}",
                    f"pick one of {compiled}, or compile it: neuron-ssp compile CONFIG --k "
                    f"{','.join(str(n) for n in sorted({*compiled, k}))}",
                )
            )
        return local, compiled

    def staging_dir(self, spec: ArtifactSpec) -> Path:
        """Where `model.save()` writes (for S3: the local copy that `publish` uploads)."""
        return self.root / spec.relative_dir

    def publish(self, spec: ArtifactSpec, compile_seconds: float) -> str:
        """Write the manifest last (a half-written directory is never reused), then upload for S3."""
        local = self.staging_dir(spec)
        (local / MANIFEST).write_text(json.dumps({**asdict(spec), "compile_seconds": compile_seconds}, indent=2))
        if self.remote:
            bucket, prefix = _split_s3(self.describe(spec))
            _upload(local, bucket, prefix)
        return self.describe(spec)


def _manifest(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _matches(directory: Path, spec: ArtifactSpec, quiet: bool = False) -> bool:
    saved = _manifest(directory)
    if saved is None:
        return False
    saved.pop("compile_seconds", None)
    if saved == json.loads(json.dumps(asdict(spec))):
        return True
    if not quiet:
        changed = sorted(key for key in saved if saved.get(key) != asdict(spec).get(key))
        warnings.warn(
            f"compiled artifacts in {directory} differ in {', '.join(changed)}; not reused "
            "(run `neuron-ssp compile` again)",
            stacklevel=3,
        )
    return False


def _split_s3(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def _s3_client() -> Any:
    try:
        import boto3
    except ImportError:
        raise RuntimeProblem(
            Problem(
                "neuron.compiled_dir",
                "s3://...",
                "an S3 store needs boto3",
                "pip install boto3 (or neuron-ssp[deploy]), or use a local directory",
            )
        ) from None
    return boto3.client("s3")


def _upload(local: Path, bucket: str, prefix: str) -> None:
    client = _s3_client()
    manifest = local / MANIFEST
    files = sorted(p for p in local.rglob("*") if p.is_file() and p != manifest)
    for path in [*files, manifest]:  # manifest last: readers never see a partial upload as complete
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def _download(bucket: str, prefix: str, local: Path) -> None:
    client = _s3_client()
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            target = local / item["Key"][len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(target))
