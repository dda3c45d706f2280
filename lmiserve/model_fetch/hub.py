"""A Hugging Face Hub repository's files, into the Hugging Face cache's own layout.

The listing (file names, sizes, blob ids and LFS sha256s, the revision's commit) comes from the Hub's
API through ``huggingface_hub`` (``HF_ENDPOINT``, ``HF_TOKEN``); the bytes from its ``resolve`` URLs,
through :mod:`.transfer` (resumable, verified against the sha256 or the git blob id). Files go to
``models--ORG--NAME/blobs/<etag>`` with ``snapshots/<commit>/NAME`` links and ``refs/<revision>``,
so ``huggingface_hub`` and transformers find them in the cache as their own.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .errors import FetchError
from .plan import FetchOptions, FetchPlan
from .selection import gguf_file, is_gguf_repo, model_files
from .source import HubRef
from .transfer import RemoteFile

log = logging.getLogger("lmiserve.download")

ATTEMPTS = 4


class Unreachable(FetchError):
    """The Hub could not be reached, after the retries."""


COMMIT = re.compile(r"^[0-9a-f]{40}$")


def cache_dir(options: FetchOptions) -> Path:
    if options.download_dir is not None:
        return Path(options.download_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def token() -> str | None:
    """``HF_TOKEN``, else the older ``HUGGING_FACE_HUB_TOKEN``, else a login's stored token."""
    found = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if found:
        return found
    from huggingface_hub import get_token

    return get_token()


def plan(ref: HubRef, options: FetchOptions) -> FetchPlan:
    repo_dir = cache_dir(options) / ("models--" + ref.repo_id.replace("/", "--"))
    revision = options.revision or "main"
    if options.offline:
        return _cached(ref, repo_dir, revision, options)
    try:
        info = _model_info(ref, revision)
    except Unreachable as exc:  # as huggingface_hub does: the revision as cached before, if it is
        try:
            cached = _cached(ref, repo_dir, revision, options)
        except FetchError:
            raise exc from None
        log.warning("%s; using the copy of %s@%s in the cache", exc, ref.repo_id, revision)
        return cached
    names = [s.rfilename for s in info.siblings or []]
    gguf = bool(options.gguf_file or ref.quant) or is_gguf_repo(names)
    chosen = [gguf_file(names, ref.repo_id, options.gguf_file, ref.quant)] if gguf else model_files(names, ref.repo_id)
    by_name = {s.rfilename: s for s in info.siblings}
    commit = info.sha
    headers = _headers()
    from huggingface_hub import constants

    files = []
    for name in chosen:
        sibling = by_name[name]
        lfs = sibling.lfs
        etag = lfs.sha256 if lfs is not None else sibling.blob_id
        if etag is None or sibling.size is None:
            raise FetchError(f"{ref.repo_id}: the Hub gave no size or blob id for {name}")
        url = f"{constants.ENDPOINT}/{ref.repo_id}/resolve/{commit}/{quote(name)}"
        remote = RemoteFile(
            name=f"{ref.repo_id}/{name}",
            size=int(sibling.size),
            version=etag,
            url=lambda url=url: url,
            headers=headers,
            sha256=lfs.sha256 if lfs is not None else None,
            git_blob_sha1=None if lfs is not None else sibling.blob_id,
        )
        files.append((remote, repo_dir / "blobs" / etag))

    def finish() -> Path:
        snapshot = repo_dir / "snapshots" / commit
        for (_, blob), name in zip(files, chosen):
            _link(snapshot / name, blob)
        if revision != commit:
            (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
            (repo_dir / "refs" / revision).write_text(commit)
        return snapshot / chosen[0] if gguf else snapshot

    return FetchPlan(ref.repo_id, repo_dir, files, finish)


def _link(path: Path, blob: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, path.parent)
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return dict(build_hf_headers(token=token() or False))


def _model_info(ref: HubRef, revision: str) -> Any:
    from huggingface_hub import HfApi, constants
    from huggingface_hub import errors as hub_errors

    given = token()
    api = HfApi(endpoint=constants.ENDPOINT, token=given or False)
    for attempt in range(ATTEMPTS):
        try:
            return api.model_info(ref.repo_id, revision=revision, files_metadata=True)
        except hub_errors.OfflineModeIsEnabled:
            raise FetchError(
                f"{ref.repo_id}: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) forbids downloading; unset it"
            ) from None
        except hub_errors.GatedRepoError:
            raise FetchError(
                f"{ref.repo_id} is a gated repository: "
                + (
                    "the HF_TOKEN given has no access to it; accept its terms on the Hub with that account"
                    if given
                    else "set HF_TOKEN to a token of an account that accepted its terms on the Hub"
                )
            ) from None
        except hub_errors.RevisionNotFoundError:
            raise FetchError(
                f"{ref.repo_id}: no revision {revision!r} (option.revision or HF_REVISION names a branch, tag or commit)"
            ) from None
        except hub_errors.HfHubHTTPError as exc:  # RepositoryNotFoundError among them
            status = _status(exc)
            if status in (401, 403):
                raise FetchError(
                    f"{ref.repo_id}: the Hub answered {status}: "
                    + (
                        "the HF_TOKEN given is not valid, or has no access to this repository"
                        if given
                        else "the repository is private or gated; set HF_TOKEN to a token with read access"
                    )
                ) from None
            if isinstance(exc, hub_errors.RepositoryNotFoundError):
                raise FetchError(
                    f"{ref.repo_id}: no such repository on {constants.ENDPOINT} (HTTP {status}); check option.model_id"
                    + ("" if given else ", and set HF_TOKEN if it is private")
                ) from None
            if status is not None and status < 500 and status != 429:
                raise FetchError(f"{ref.repo_id}: the Hub answered HTTP {status}") from None
            failure = f"HTTP {status}"
        except OSError as exc:  # the connection: httpx's errors are OSErrors' kin
            failure = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - httpx's transport errors
            if not type(exc).__module__.startswith(("httpx", "httpcore")):
                raise
            failure = f"{type(exc).__name__}: {exc}"
        if attempt + 1 < ATTEMPTS:
            time.sleep(2**attempt)
    raise Unreachable(
        f"{ref.repo_id}: cannot reach {constants.ENDPOINT} after {ATTEMPTS} attempts ({failure}); "
        "check the network, set HF_ENDPOINT for a mirror, or HF_HUB_OFFLINE=1 with the model in the cache"
    )


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _cached(ref: HubRef, repo_dir: Path, revision: str, options: FetchOptions) -> FetchPlan:
    """HF_HUB_OFFLINE=1: the revision's snapshot in the cache, fetched before."""
    commit = revision if COMMIT.match(revision) else None
    ref_file = repo_dir / "refs" / revision
    if commit is None and ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = repo_dir / "snapshots" / (commit or "-")
    if commit is None or not snapshot.is_dir():
        raise FetchError(
            f"{ref.repo_id}@{revision} is not in the Hugging Face cache ({repo_dir.parent}) and HF_HUB_OFFLINE=1 "
            "forbids downloading it: unset HF_HUB_OFFLINE, or fetch it once with network access"
        )
    names = [str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()]
    if options.gguf_file or ref.quant or is_gguf_repo(names):
        chosen = gguf_file(names, ref.repo_id, options.gguf_file, ref.quant)
        return FetchPlan(ref.repo_id, repo_dir, [], lambda: snapshot / chosen)
    return FetchPlan(ref.repo_id, repo_dir, [], lambda: snapshot)
