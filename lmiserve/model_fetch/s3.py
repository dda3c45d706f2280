"""An S3 prefix's objects, into ``DOWNLOAD_DIR/s3/BUCKET/PREFIX``.

The listing and the signatures come from boto3, with its usual credential chain (environment,
profile, instance or task role) and endpoint settings (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``:
MinIO, LocalStack, a private endpoint); the bytes come by presigned ranged GETs through
:mod:`.transfer`. A manifest (``.lmiserve-s3.json``: each file's size and ETag) makes a file that is
unchanged at the source one that is not fetched again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import FetchError
from .plan import FetchOptions, FetchPlan
from .source import S3Ref
from .transfer import STREAMS, RemoteFile, part_paths

MANIFEST = ".lmiserve-s3.json"
SIGNED_FOR_S = 6 * 3600


def _client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise FetchError("s3:// model ids need boto3 (pip install boto3)") from None
    # boto3's standard retries, with backoff (AWS_MAX_ATTEMPTS, else 3 attempts)
    config = Config(retries={"mode": "standard"}, max_pool_connections=STREAMS)
    return boto3.session.Session().client("s3", config=config)  # the credential chain read afresh


def _listing(client: Any, ref: S3Ref) -> list[dict[str, Any]]:
    """The objects the prefix names: every object under ``KEY/`` (or the bucket), or the one object
    ``KEY`` itself."""
    prefix = ref.key
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for item in page.get("Contents") or []:
            key = item["Key"]
            if key.endswith("/"):
                continue  # a "folder" marker
            if prefix and not prefix.endswith("/") and key != prefix and not key.startswith(prefix + "/"):
                continue  # s3://b/model must not take s3://b/model-v2/...
            objects.append(item)
    return objects


def _explain(exc: Exception, ref: S3Ref) -> FetchError:
    from botocore import exceptions as bx

    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return FetchError(
            f"{ref.url}: no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE, or give the instance or task a role"
        )
    if isinstance(exc, bx.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return FetchError(f"{ref.url}: the bucket {ref.bucket!r} does not exist")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
            return FetchError(f"{ref.url}: S3 did not accept the credentials ({code}): check the AWS credentials")
        if code in ("AccessDenied", "AllAccessDisabled") or status == 403:
            return FetchError(
                f"{ref.url}: access denied ({code or status}): the credentials need s3:ListBucket on the bucket "
                "and s3:GetObject on the prefix"
            )
        return FetchError(f"{ref.url}: S3 answered {code or status}")
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return FetchError(
            f"{ref.url}: cannot reach S3 after retries ({exc}); check the network, or AWS_ENDPOINT_URL_S3 "
            "for a private endpoint"
        )
    return FetchError(f"{ref.url}: {type(exc).__name__}: {exc}")


def plan(ref: S3Ref, options: FetchOptions) -> FetchPlan:
    if not ref.bucket:
        raise FetchError(f"{ref.url}: no bucket named (s3://BUCKET/PREFIX/)")
    if options.download_dir is None:
        raise FetchError(f"{ref.url}: no download directory")
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client()
    try:
        objects = _listing(client, ref)
    except (BotoCoreError, ClientError) as exc:
        raise _explain(exc, ref) from None
    if not objects:
        raise FetchError(f"{ref.url}: no objects under this prefix in bucket {ref.bucket!r}; check option.model_id")
    key = ref.key.rstrip("/")
    single = len(objects) == 1 and objects[0]["Key"] == ref.key and not ref.key.endswith("/")
    directory = Path(options.download_dir) / "s3" / ref.bucket / (str(Path(key).parent) if single else key)
    files = []
    manifest_path = directory / MANIFEST
    manifest = _read(manifest_path)
    wanted: dict[str, dict[str, Any]] = {}
    for item in objects:
        relative = Path(item["Key"]).name if single else item["Key"][len(key) :].lstrip("/")
        if not relative or ".." in Path(relative).parts:
            continue
        dest = directory / relative
        etag = str(item.get("ETag", "")).strip('"')
        wanted[relative] = {"size": int(item["Size"]), "etag": etag}
        if manifest.get(relative) != wanted[relative] and dest.is_file():
            dest.unlink()  # changed at the source
        remote = RemoteFile(
            name=f"s3://{ref.bucket}/{item['Key']}",
            size=int(item["Size"]),
            version=etag,
            url=lambda key=item["Key"]: _sign(client, ref, key),
        )
        files.append((remote, dest))
    for relative in set(manifest) - set(wanted):  # gone at the source: not part of the model any more
        (directory / relative).unlink(missing_ok=True)
        for path in part_paths(directory / relative):
            path.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    _write(manifest_path, wanted)
    return FetchPlan(ref.url, directory, files, lambda: directory / Path(key).name if single else directory)


def _sign(client: Any, ref: S3Ref, key: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(
            client.generate_presigned_url(
                "get_object", Params={"Bucket": ref.bucket, "Key": key}, ExpiresIn=SIGNED_FOR_S
            )
        )
    except (BotoCoreError, ClientError) as exc:
        raise _explain(exc, ref) from None


def _read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _write(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, path)
