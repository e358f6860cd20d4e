"""Where archives are kept: a local folder or an S3-compatible bucket. One archive is a folder
(or key prefix) named for it, holding ``manifest.json`` and its compressed files."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from attempts.verify_export import read_folder

# Names we write and read: archive names and file names alike.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class StoreError(Exception):
    """The archive store cannot be used; the message says what to fix."""


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise StoreError(f"not an archive or file name: {name!r}")
    return name


class FolderStore:
    """Archives under one local folder: ``<root>/<archive>/<file>``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def location(self, archive: str) -> str:
        return str(self.root.resolve() / _checked(archive))

    def put(self, archive: str, name: str, data: bytes) -> None:
        folder = self.root / _checked(archive)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / _checked(name)
        if path.exists():
            raise StoreError(f"{path} exists already: an archive is never overwritten")
        partial = path.with_name(f".{name}.partial")
        with partial.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        partial.rename(path)

    def reader(self, archive: str) -> Callable[[str], bytes | None]:
        return read_folder(self.root / _checked(archive))

    def archives(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "manifest.json").is_file())


# Deadlines on every call to the bucket (botocore's own default is a minute each, retried): a
# bucket that stops answering fails the archive run with a clear error instead of holding it.
S3_CONNECT_TIMEOUT = 10
S3_READ_TIMEOUT = 60


class S3Store:
    """Archives in an S3-compatible bucket: ``s3://bucket/prefix/<archive>/<file>``. Endpoint
    and credentials come from boto3's own configuration (``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, profiles)."""

    def __init__(self, bucket: str, prefix: str = "") -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise StoreError(
                "archives in a bucket need boto3: pip install 'ledgerweb[s3]'"
            ) from None
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = boto3.client(
            "s3",
            config=Config(
                connect_timeout=S3_CONNECT_TIMEOUT,
                read_timeout=S3_READ_TIMEOUT,
                retries={"max_attempts": 5, "mode": "standard"},
            ),
        )

    def _key(self, archive: str, name: str = "") -> str:
        parts = [p for p in (self.prefix, _checked(archive), name and _checked(name)) if p]
        return "/".join(parts)

    def location(self, archive: str) -> str:
        return f"s3://{self.bucket}/{self._key(archive)}"

    def _errors(self):
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError)

    def put(self, archive: str, name: str, data: bytes) -> None:
        import hashlib

        key = self._key(archive, name)
        try:
            # Never overwrite (S3 conditional writes), and the bucket checks the bytes it got.
            self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                IfNoneMatch="*",
                ChecksumSHA256=_b64(hashlib.sha256(data).digest()),
            )
        except self._errors() as exc:
            raise StoreError(f"cannot write s3://{self.bucket}/{key}: {exc}") from None

    def reader(self, archive: str) -> Callable[[str], bytes | None]:
        def read(name: str) -> bytes | None:
            if not _NAME.match(name):
                return None
            key = self._key(archive, name)
            try:
                return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except self._errors() as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                if code in ("NoSuchKey", "404"):
                    return None
                raise StoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from None

        return read

    def archives(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        names = set()
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    rest = item["Key"][len(prefix) :]
                    if rest.count("/") == 1 and rest.endswith("/manifest.json"):
                        names.add(rest.split("/", 1)[0])
        except self._errors() as exc:
            raise StoreError(f"cannot list s3://{self.bucket}/{prefix}: {exc}") from None
        return sorted(names)


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


Store = FolderStore | S3Store


def open_store(where: str) -> Store:
    """A store for ``where``: ``s3://bucket[/prefix]`` or a local folder."""
    if not where:
        raise StoreError("say where archives are: a folder or s3://bucket/prefix")
    if where.startswith("s3://"):
        parts = urlsplit(where)
        if not parts.netloc:
            raise StoreError(f"{where}: an S3 location is s3://bucket[/prefix]")
        return S3Store(parts.netloc, parts.path)
    if "://" in where:
        raise StoreError(f"{where}: archives go to a folder or s3://bucket/prefix")
    return FolderStore(where)
