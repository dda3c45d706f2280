"""Fetching one model (or adapter): under a lock, with the disk checked first, resumable, reported."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from ..file_lock import file_lock
from . import hub, s3
from .errors import FetchError, human_bytes
from .plan import FetchOptions, FetchPlan
from .progress import Progress
from .source import HubRef, parse
from .transfer import DiskFull, Transfer, part_paths, remaining_bytes

log = logging.getLogger("lmiserve.download")


def is_remote(model_id: str | None, base: Path | None = None) -> bool:
    """Whether ``model_id`` names a Hub repository or an S3 prefix (not a local path)."""
    return parse(model_id, base) is not None


def fetch_model(model_id: str, base: Path | None, options: FetchOptions) -> Path:
    """The local path of ``model_id``'s files (a directory, or a .gguf file), fetched if they are
    not all there. Raises :class:`FetchError` with what to set."""
    ref = parse(model_id, base)
    if ref is None:
        raise FetchError(f"{model_id}: not a Hugging Face Hub id (org/name) or an s3:// prefix")
    root = hub.cache_dir(options) if isinstance(ref, HubRef) else options.download_dir
    if root is None:
        raise FetchError(f"{model_id}: no download directory")
    key = f"{model_id}@{options.revision or ''}:{options.gguf_file or ''}"
    lock = Path(root) / ".locks" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock")
    # one process fetches a model at a time; the others wait, then find its files in place
    with file_lock(lock, on_wait=lambda: log.info("another process is downloading this model; waiting for it")):
        plan = hub.plan(ref, options) if isinstance(ref, HubRef) else s3.plan(ref, options)
        _download(plan, options)
        path = plan.finish()
    log.info("%s: in %s", model_id, path)
    return path


def _download(plan: FetchPlan, options: FetchOptions) -> None:
    unique = {dest: remote for remote, dest in plan.files}  # one blob may have two names
    for dest, remote in unique.items():
        if remote.size == 0 and not dest.is_file():  # nothing to fetch, but the file must be there
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.touch()
    missing = {dest: remaining_bytes(remote, dest) for dest, remote in unique.items()}
    pending = [(remote, dest) for dest, remote in unique.items() if missing[dest]]
    needed = sum(missing.values())
    if not needed:
        if plan.files:
            log.info("%s: every file is in %s already", plan.what, plan.directory)
        return
    free = _free_bytes(plan.directory)
    if free is not None and free < needed:
        _remove_parts(pending)
        raise FetchError(_no_space(plan, needed, free))
    progress = Progress(f"{plan.what}", needed)
    try:
        with progress:
            Transfer(progress, deadline=options.deadline).fetch(pending)
    except DiskFull:
        _remove_parts(pending)
        raise FetchError(_no_space(plan, needed - progress.done, _free_bytes(plan.directory) or 0)) from None


def _no_space(plan: FetchPlan, needed: int, free: int) -> str:
    return (
        f"{plan.what}: not enough disk space in {plan.directory}: {human_bytes(needed)} ({needed} bytes) more are "
        f"needed and {human_bytes(free)} are free; the partial files were removed. Free space there, or set "
        "option.download_dir (HF_HOME for Hub ids) to a larger volume"
    )


def _free_bytes(directory: Path) -> int | None:
    for path in (directory, *directory.parents):
        if path.exists():
            return shutil.disk_usage(path).free
    return None


def _remove_parts(files: list) -> None:  # type: ignore[type-arg]
    for _, dest in files:
        for path in part_paths(dest):
            path.unlink(missing_ok=True)
