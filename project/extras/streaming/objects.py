"""Optimized data sets on S3 or an S3-compatible store (MinIO, Ceph, R2, ...), through boto3.

The endpoint and credentials come from the usual AWS settings, as for any AWS tool:
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` or a profile (``AWS_PROFILE``), and
``AWS_ENDPOINT_URL`` for a store other than AWS. Every failure to reach the data (no such
bucket, no credentials, refused credentials, an endpoint that does not answer) is one line
naming the URL, the endpoint and the setting to fix, raised before any training starts.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.config
import botocore.exceptions
from litdata.streaming.downloader import Downloader, register_downloader

from project.errors import ConfigError

SPLITS = ("train", "val", "test")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# a few quick tries: a wrong endpoint must fail in seconds, not after minutes of retries
CONFIG = botocore.config.Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3})


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket:
        raise ConfigError(f"'{url}' is not an S3 URL: use s3://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


def key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def endpoint() -> str:
    """The endpoint requests go to, as the error messages name it."""
    return next((os.environ[v] for v in ENDPOINT_VARIABLES if os.environ.get(v)), "AWS S3")


def client():
    """A new client in a session of its own: safe in LitData's download threads and in forked
    loader workers, and it reads the endpoint and credentials from the environment as it is now."""
    return boto3.session.Session().client("s3", config=CONFIG)


@contextlib.contextmanager
def errors(url: str) -> Iterator[None]:
    """boto3's exceptions about reaching ``url`` as one line each, with the fix."""
    bucket, _ = split_url(url)
    try:
        yield
    except botocore.exceptions.NoCredentialsError as err:
        raise ConfigError(f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                          "(or AWS_PROFILE) in the environment of every process that reads it") from err
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError) as err:
        raise ConfigError(f"cannot reach the object store at {endpoint()} for {url} ({err}): check "
                          "AWS_ENDPOINT_URL and that the store is up") from err
    except botocore.exceptions.ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            raise ConfigError(f"there is no bucket '{bucket}' at {endpoint()} (for {url}): check the "
                              "bucket name, or AWS_ENDPOINT_URL if it lives on another store") from err
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise ConfigError(f"{endpoint()} refused the credentials for {url} ({code}): check "
                              "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the "
                              "bucket's permissions") from err
        raise ConfigError(f"{url}: the object store at {endpoint()} answered {code}: {err}") from err
    except botocore.exceptions.BotoCoreError as err:
        raise ConfigError(f"{url}: {err} (check the AWS_* settings for {endpoint()})") from err


def read_json(url: str, name: str) -> dict | None:
    """``name`` under ``url`` as JSON; None if there is no such object (the bucket exists)."""
    bucket, prefix = split_url(url)
    with errors(url):
        s3 = client()
        try:  # a missing bucket is NoSuchBucket, mapped by errors()
            body = s3.get_object(Bucket=bucket, Key=key(prefix, name))["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def list_keys(url: str) -> list[str]:
    """Every object name under ``url``, relative to it."""
    bucket, prefix = split_url(url)
    names = []
    with errors(url):
        for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key(prefix, "")):
            names += [o["Key"].removeprefix(key(prefix, "")) for o in page.get("Contents", [])]
    return names


def upload_folder(folder: Path, url: str, last: str) -> int:
    """Copy ``folder`` to ``url`` with ``last`` uploaded after everything else (so it marks a
    complete copy), then delete objects of an earlier copy that are not in this one; bytes sent."""
    bucket, prefix = split_url(url)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = {p.relative_to(folder).as_posix() for p in files}
    sent = 0
    with errors(url):
        s3 = client()
        for path in sorted(files, key=lambda p: p.relative_to(folder).as_posix() == last):
            s3.upload_file(str(path), bucket, key(prefix, path.relative_to(folder).as_posix()))
            sent += path.stat().st_size
        for n in list_keys(url):
            if n not in names and n.split("/")[0] in SPLITS:
                s3.delete_object(Bucket=bucket, Key=key(prefix, n))
    return sent


def delete(url: str, name: str) -> None:
    bucket, prefix = split_url(url)
    with errors(url):
        client().delete_object(Bucket=bucket, Key=key(prefix, name))


class BotoDownloader(Downloader):
    """LitData's chunk downloads through boto3, for S3-compatible stores.

    LitData 0.2.7x fetches chunks with obstore, which is given fixed client options and so
    refuses a plain-HTTP endpoint and any certificate authority of the system's own (a MinIO in
    the lab, a test server); boto3 honours every AWS setting (``AWS_CA_BUNDLE`` among them).
    Used only when ``AWS_ENDPOINT_URL`` names such a store; AWS itself keeps LitData's own.
    """

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        if os.path.exists(local_filepath):
            return
        bucket, name = split_url(remote_filepath)
        os.makedirs(os.path.dirname(local_filepath) or ".", exist_ok=True)
        tmp = f"{local_filepath}.tmp.{os.getpid()}"
        try:
            client().download_file(bucket, name, tmp)
            os.replace(tmp, local_filepath)  # never a half-written chunk in the cache
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def route_compatible_stores() -> None:
    """Chunk reads of s3:// through boto3 when ``AWS_ENDPOINT_URL`` names a store other than AWS.
    Called on import too, for loader workers and DDP ranks that start a new interpreter."""
    if any(os.environ.get(v) for v in ENDPOINT_VARIABLES):
        register_downloader("s3://", BotoDownloader, overwrite=True)


route_compatible_stores()
