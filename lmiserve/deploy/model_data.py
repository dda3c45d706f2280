"""A local model directory into S3: one ``model.tar.gz``, or the files themselves under a prefix.

SageMaker unpacks a ``model.tar.gz`` into ``/opt/ml/model`` before the container starts; files under
an S3 prefix (``s3://bucket/prefix/``) are copied there as they are, which skips compressing and
unpacking many gigabytes of weights that do not compress anyway.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Log = Callable[[str], None]
_SKIP = {".git", "__pycache__", ".ipynb_checkpoints"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise ValueError(f"not an S3 URI: {uri!r} (expected s3://bucket/key)")
    return bucket, key


def model_files(model_dir: Path) -> list[Path]:
    """The files to ship, relative to ``model_dir``, sorted (no VCS or cache directories)."""
    files = []
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP)
        for name in sorted(names):
            files.append((Path(root) / name).relative_to(model_dir))
    if not files:
        raise ValueError(f"{model_dir} holds no files")
    return files


def package(model_dir: Path, destination: Path) -> Path:
    """``model_dir``'s contents as a gzip-compressed tar with the files at its root.

    Symbolic links (a Hugging Face cache snapshot is made of them) are stored as the files they point
    at. Compression level 1: weights barely compress, and the archive is made again for every upload.
    """
    with tarfile.open(destination, "w:gz", compresslevel=1, dereference=True) as archive:
        for relative in model_files(model_dir):
            archive.add(model_dir / relative, arcname=relative.as_posix(), recursive=False)
    return destination


def upload_model_dir(
    s3: Any, model_dir: Path, bucket: str, prefix: str, *, uncompressed: bool = False, log: Log = print
) -> str:
    """Upload ``model_dir`` and return what SageMaker's model data should point at."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir} is not a directory")
    prefix = prefix.strip("/")
    if uncompressed:
        files = model_files(model_dir)
        total = sum((model_dir / f).stat().st_size for f in files)
        log(f"uploading {len(files)} files ({_size(total)}) to s3://{bucket}/{prefix}/")
        progress = _Progress(total, log)
        for relative in files:
            s3.upload_file(str(model_dir / relative), bucket, f"{prefix}/{relative.as_posix()}", Callback=progress)
        return f"s3://{bucket}/{prefix}/"
    with tempfile.TemporaryDirectory(prefix="lmiserve-model-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        log(f"packaging {model_dir} into model.tar.gz")
        package(model_dir, archive)
        size = archive.stat().st_size
        key = f"{prefix}/model.tar.gz"
        log(f"uploading model.tar.gz ({_size(size)}) to s3://{bucket}/{key}")
        s3.upload_file(str(archive), bucket, key, Callback=_Progress(size, log))
    return f"s3://{bucket}/{key}"


def check_model_data(s3: Any, uri: str, log: Log = print) -> None:
    """Fail now, not half an hour into the deployment, when the model data is not there."""
    from botocore.exceptions import ClientError

    bucket, key = parse_s3_uri(uri)
    try:
        if key.endswith("/") or not key:
            found = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("KeyCount", 0) > 0
        else:
            s3.head_object(Bucket=bucket, Key=key)
            found = True
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code not in ("404", "NoSuchKey", "NoSuchBucket", "NotFound"):
            log(f"note: cannot check {uri} ({code}); the endpoint's role may still read it")
            return
        found = False
    if not found:
        raise ValueError(f"no model data at {uri}")


class _Progress:
    """An upload callback (called from transfer threads) that logs every further 10 %."""

    def __init__(self, total: int, log: Log) -> None:
        self._total = max(total, 1)
        self._done = 0
        self._next = 10
        self._log = log
        self._lock = threading.Lock()

    def __call__(self, transferred: int) -> None:
        with self._lock:
            self._done += transferred
            percent = self._done * 100 // self._total
            if percent >= self._next:
                self._next = percent // 10 * 10 + 10
                self._log(f"  uploaded {percent}% ({_size(self._done)})")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
