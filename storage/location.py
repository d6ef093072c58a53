"""Where a sweep store lives, behind one interface: a local folder, or an object store URL.

A store is named by a path (`runs/study.zarr`, `file:///data/study.zarr`) or a URL (`s3://bucket/
prefix/study.zarr`, `gs://…`, `az://…`, `memory://name` for tests), with `storage_options` that
say how to reach it (endpoint, region, profile, anonymous read, backend) but never who is asking:
credentials come from the standard chains (environment variables, profiles, instance or pod
roles), so a `StoreRef` can travel in task specs, the resolved config and messages.

Everything a sweep keeps goes through a `Location` (`locate(ref)`): the Zarr data through zarr's
own store classes (`zarr_store()`), and the bookkeeping beside it (markers, checkpoints, the
lease) as whole objects under keys relative to the store's root: `read`, `write` (atomic
replace), `create` (only if absent: the lease's conditional write), `replace` (only if
unchanged since a version), `delete`, `delete_prefix`, `info`, `listing` (one listing: every key
under a prefix with its size and version). A version is what changes when an object is
rewritten: the file's `st_mtime_ns` on a local folder, the object's ETag on an object store.

Backends (`storage_options.backend`): `obstore` (the default for object stores: zarr's
`ObjectStore` over obstore's Rust client, which also gives the conditional writes and listings)
or `fsspec` (zarr's `FsspecStore` over s3fs, S3 only); `benchmarks/README.md` measures both.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import os
import re
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from storage.errors import EnvironmentFault, InputError, StoreDamagedError

OBJECT_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure",
                  "abfs": "azure", "abfss": "azure", "azure": "azure"}
LOCAL_SCHEMES = ("", "file")
MEMORY_SCHEME = "memory"
PROVIDER_EXTRAS = {"s3": "s3", "gcs": "gcs", "azure": "azure"}  # pip extra per provider
STORAGE_OPTIONS = {
    "endpoint_url": "an S3-compatible server's URL (also read from AWS_ENDPOINT_URL)",
    "region": "the bucket's region",
    "profile": "an AWS profile name (needs boto3)",
    "anon": "read without credentials (public buckets)",
    "backend": "obstore (default) or fsspec (s3fs; S3 only)",
}
CREDENTIAL_WORDS = ("key", "secret", "token", "password", "credential", "sas")
CREDENTIALS_FIX = ("set them in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                   "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*), a profile, or the "
                   "machine's role (docs/storage.md)")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")  # read by the S3 clients
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s'\"<>]*)")
BACKENDS = ("obstore", "fsspec")
PARALLEL = 16  # concurrent requests of read_many / infos on an object store
RETRIES = {"max_retries": 3, "retry_timeout": datetime.timedelta(seconds=30)}  # default: 10, 3 min


class StoreUnreachable(EnvironmentFault):
    """The store's server, bucket or credentials do not let this process reach it."""


@dataclass(frozen=True)
class StoreRef:
    """A store's name (path or URL) and its storage options, hashable and safe to ship and to
    print: `str(ref)` is the URL (no credential is ever part of it)."""

    url: str
    options: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        return self.url

    @property
    def scheme(self) -> str:
        return scheme_of(self.url)

    @property
    def is_local(self) -> bool:
        return self.scheme in LOCAL_SCHEMES

    @property
    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    @classmethod
    def of(cls, store: StoreLike, options: Mapping[str, Any] | None = None) -> StoreRef:
        """`store` as a StoreRef (a StoreRef keeps its own options unless `options` are given);
        InputError for a URL or option that carries credentials (`check_no_userinfo`)."""
        if isinstance(store, StoreRef):
            return store if options is None else cls(store.url, _options(options))
        if isinstance(store, Location):
            return store.ref
        url = os.fspath(store)
        check_no_userinfo(url, "store")
        return cls(url, _options(options or {}))


def redact_url(text: str) -> str:
    """`text` with the userinfo (`user:password@`) of every URL in it replaced by `***@`, and
    the value of every query or fragment parameter whose name looks like a credential
    (`secret_parameters`: `?access_token=***`): what every message, attribute, marker and
    report passes a text that may quote a URL through."""
    def hide(match: re.Match) -> str:
        rest = match["rest"]
        at = _userinfo_end(rest, schemed=True)
        if at >= 0:
            rest = f"***@{rest[at + 1:]}"
        return match["scheme"] + _PARAMETER.sub(_mask, rest)

    return _URL.sub(hide, text) if "@" in text or "=" in text else text


SECRET_WORDS = (*CREDENTIAL_WORDS, "signature", "sig", "passwd", "pwd", "auth")
"""What a query parameter's name holds (any case) when its value is a credential: presigned S3
(`X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`), GCS (`X-Goog-Signature`),
Azure SAS (`sig`), OAuth (`access_token`), API keys (`api_key`, `apikey`)."""
_PARAMETER = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#?]*)=(?P<value>[^&;#]*)")


def _mask(match: re.Match) -> str:
    if not match["value"] or not any(w in match["name"].lower() for w in SECRET_WORDS):
        return match[0]
    return f"{match['lead']}{match['name']}=***"


def secret_parameters(url: str) -> list[str]:
    """The names of the query (or fragment) parameters of a URL (`scheme://...`) whose name
    looks like a credential and whose value is not empty (`SECRET_WORDS`)."""
    head, sep, rest = url.partition("://")
    if not sep:
        return []  # a path: `?` and `#` are part of its file names
    tail = rest[min((i for i in map(rest.find, "?#") if i >= 0), default=len(rest)):]
    return [m["name"] for m in _PARAMETER.finditer(tail)
            if m["value"] and any(w in m["name"].lower() for w in SECRET_WORDS)]


def _userinfo_end(rest: str, schemed: bool) -> int:
    """The index in `rest` (a URL after its `scheme://`, or a scheme-less address such as
    `host:port`) of the `@` that ends a userinfo, or -1. A password holding `/`, `?` or `#`
    (which end a URL's authority: `key:se/cret@host`) counts too: its `user:` is followed by
    no port, or by a query or fragment before an `@`; then everything up to the last `@` is
    taken for the userinfo (hiding too much rather than a part of the secret)."""
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    user, colon, port = authority.rpartition("@")[2].partition(":")
    if "@" in authority:
        return authority.rfind("@") if schemed or ":" in authority.partition("@")[0] else -1
    if "@" not in rest[end:] or not colon or (not schemed and len(user) < 2):  # C:/a@b
        return -1
    return rest.rfind("@") if not port.isdigit() or rest[end] in "?#" else -1


def has_userinfo(url: str) -> bool:
    """Whether `url` names a user or password before its host (`scheme://user:secret@host`,
    also with `/`, `?` or `#` in the secret; `user:secret@host:port` without a scheme)."""
    head, sep, rest = url.partition("://")
    return _userinfo_end(rest if sep else head, schemed=bool(sep)) >= 0


def has_credentials(url: str) -> bool:
    """Whether `url` carries a credential: a userinfo (`has_userinfo`) or a query parameter
    that looks like one (`secret_parameters`: a token or presigned URL)."""
    return has_userinfo(url) or bool(secret_parameters(url))


def check_no_userinfo(url: str, where: str, fix: str = "") -> None:
    """InputError naming `where` and the URL (its userinfo and secret parameters hidden) if the
    URL carries credentials (`has_credentials`): they would end up in the store's attributes,
    its logs and every message. `fix`: what to do instead (default: the standard credential
    chains)."""
    if has_userinfo(url):
        shown = redact_url(url) if "://" in url else "***@" + url.rpartition("@")[2]
        raise InputError(
            f"{where} {shown}: the URL carries credentials (user:password@), which would be "
            f"written into the store, logs and messages; remove them from the URL and "
            f"{fix or CREDENTIALS_FIX}")
    names = secret_parameters(url)
    if names:
        raise InputError(
            f"{where} {redact_url(url)}: the URL carries credentials (its parameter "
            f"{', '.join(dict.fromkeys(names))}), which would be written into the store, logs "
            f"and messages; remove them from the URL and {fix or CREDENTIALS_FIX}")



def scheme_of(url: str) -> str:
    """The URL's scheme, '' for a plain path (a Windows drive letter is no scheme)."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and len(head) > 1 else ""


def check_options(options: Mapping[str, Any], where: str = "storage_options") -> dict[str, Any]:
    """The storage options, refused by name if unknown or if they would carry a credential."""
    out = {}
    for key, value in options.items():
        if any(word in key.lower() for word in CREDENTIAL_WORDS):
            raise InputError(
                f"{where}.{key}: credentials never go in a config (they would be written into "
                f"the store and its logs); {CREDENTIALS_FIX}"
            )
        if key not in STORAGE_OPTIONS:
            known = ", ".join(STORAGE_OPTIONS)
            raise InputError(f"{where}.{key}: unknown storage option; known: {known}")
        if not isinstance(value, str | bool | int | float):
            raise InputError(f"{where}.{key}: {value!r}; a storage option is a string, a "
                             f"number or true/false")
        if isinstance(value, str):
            check_no_userinfo(value, f"{where}.{key}")
        if key == "backend" and value not in BACKENDS:
            raise InputError(f"{where}.backend: {value!r}; choose {' or '.join(BACKENDS)}")
        out[key] = value
    return out


def _options(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(check_options(options).items()))


def check_url(url: str) -> None:
    """InputError naming the URL if its scheme is not one a store can live at, or if it
    carries credentials (`check_no_userinfo`)."""
    check_no_userinfo(url, "store")
    scheme = scheme_of(url)
    if scheme in LOCAL_SCHEMES or scheme == MEMORY_SCHEME or scheme in OBJECT_SCHEMES:
        if scheme in OBJECT_SCHEMES and not urlsplit(url).netloc:
            raise InputError(f"store {url}: no bucket in the URL; write {scheme}://BUCKET/PATH")
        return
    known = ", ".join(sorted({*OBJECT_SCHEMES, MEMORY_SCHEME, "file"}))
    raise InputError(f"store {url}: unknown URL scheme {scheme!r}; use a local path or one of "
                     f"{known}")


@dataclass(frozen=True)
class ObjectInfo:
    """An object's size in bytes and its version (`st_mtime_ns` locally, the ETag remotely)."""

    size: int
    version: int | str


class Location(ABC):
    """One store's root: zarr's store for the data, whole objects for the bookkeeping."""

    ref: StoreRef

    def __str__(self) -> str:
        return self.ref.url

    @property
    def is_local(self) -> bool:
        return self.ref.is_local

    @abstractmethod
    def zarr_store(self, *, read_only: bool = False) -> Any:
        """A zarr store (`zarr.abc.store.Store`) rooted at this location."""

    @abstractmethod
    def read(self, key: str) -> bytes | None:
        """The object's bytes, or None if it does not exist."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Create or replace the object; readers see the old or the new bytes, never a mix."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> str | int | None:
        """Create the object only if it does not exist (atomically): its version, or None if
        it existed already."""

    @abstractmethod
    def replace(self, key: str, data: bytes, version: str | int) -> str | int | None:
        """Replace the object only if its version is still `version`: the new version, or None
        if it changed or vanished since."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object if it exists."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix` ('' for the whole store)."""

    @abstractmethod
    def info(self, key: str) -> ObjectInfo | None:
        """The object's size and version, or None if it does not exist."""

    @abstractmethod
    def listing(self, prefix: str = "") -> dict[str, ObjectInfo]:
        """Every object under `prefix` with its size and version, keys relative to the root."""

    @abstractmethod
    def any_key(self, prefix: str = "") -> bool:
        """Whether any object exists under `prefix` (one small listing request)."""

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """`read` of every key (concurrently on an object store)."""
        return dict(zip(keys := list(keys), self._map(self.read, keys), strict=True))

    def infos(self, keys: Iterable[str]) -> dict[str, ObjectInfo | None]:
        """`info` of every key (concurrently on an object store)."""
        return dict(zip(keys := list(keys), self._map(self.info, keys), strict=True))

    def _map(self, function, keys: list[str]) -> list:
        return [function(key) for key in keys]

    def probe(self) -> None:
        """Reach the store once (a listing of one key): StoreUnreachable or InputError naming
        the URL and the fix if the server, bucket or credentials do not let us."""
        self.any_key("")

    def local_path(self) -> Path | None:
        """The store's folder on this machine, or None for an object store."""
        return None


StoreLike = str | os.PathLike | StoreRef | Location  # what storage's functions take as a store


class LocalLocation(Location):
    """A store in a local (or shared POSIX) folder."""

    def __init__(self, ref: StoreRef) -> None:
        self.ref = ref
        url = ref.url
        self.root = Path(url[len("file://"):] if ref.scheme == "file" else url).expanduser()

    def local_path(self) -> Path:
        return self.root

    def zarr_store(self, *, read_only: bool = False) -> Any:
        from zarr.storage import LocalStore

        return LocalStore(self.root, read_only=read_only)

    def _path(self, key: str) -> Path:
        return self.root / key

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def _staged(self, key: str, data: bytes) -> tuple[Path, str]:
        """`key`'s path (its folder made) and a synced temporary file beside it holding `data`."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path, tmp

    def write(self, key: str, data: bytes) -> None:
        path, tmp = self._staged(key, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def create(self, key: str, data: bytes) -> int | None:
        """Whole or absent, like `write`: the bytes go to a temporary file that is hard-linked
        into place (a link fails if the name exists), so no reader sees a created file empty."""
        path, tmp = self._staged(key, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as error:  # a filesystem without hard links: an exclusive open instead
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            return self._create_exclusive(path, data)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path.stat().st_mtime_ns

    @staticmethod
    def _create_exclusive(path: Path, data: bytes) -> int | None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return path.stat().st_mtime_ns

    def replace(self, key: str, data: bytes, version: str | int) -> int | None:
        found = self.info(key)
        if found is None or found.version != version:
            return None
        self.write(key, data)
        return self._path(key).stat().st_mtime_ns

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            self._path(key).unlink()

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix) if prefix else self.root
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            self.delete(prefix)

    def info(self, key: str) -> ObjectInfo | None:
        try:
            stat = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(stat.st_size, stat.st_mtime_ns)

    def listing(self, prefix: str = "") -> dict[str, ObjectInfo]:
        """Every file under `prefix`; StoreDamagedError naming the first symbolic link met
        inside the store (`sweep run` would write chunks through it, outside the store; the
        store's own folder may be a link)."""
        base = self._path(prefix) if prefix else self.root
        out = {}
        folders = [base]
        while folders:
            try:
                entries = os.scandir(folders.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise self._link(Path(entry.path))
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        stat = entry.stat(follow_symlinks=False)
                        key = Path(entry.path).relative_to(self.root).as_posix()
                        out[key] = ObjectInfo(stat.st_size, stat.st_mtime_ns)
        return out

    def _link(self, path: Path) -> StoreDamagedError:
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        return StoreDamagedError(
            f"store {self.root}: {path.relative_to(self.root).as_posix()} is a symbolic "
            f"link{target}; a store holds no links (sweep would write "
            f"through it, outside the store): put what it points to in its place, or delete "
            f"it and rerun `sweep run` to recompute what it held"
        )

    def any_key(self, prefix: str = "") -> bool:
        base = self._path(prefix) if prefix else self.root
        return any(files for _, _, files in os.walk(base))

    def probe(self) -> None:
        return None


class ObjectLocation(Location):
    """A store on an object store (S3, GCS, Azure, or obstore's in-memory store), through
    obstore: zarr's `ObjectStore` for the data, obstore's calls for the bookkeeping."""

    def __init__(self, ref: StoreRef, store: Any) -> None:
        self.ref = ref
        self.store = store

    def zarr_store(self, *, read_only: bool = False) -> Any:
        from zarr.storage import ObjectStore

        return ObjectStore(self.store, read_only=read_only)

    def read(self, key: str) -> bytes | None:
        import obstore

        with self._errors(key):
            try:
                return obstore.get(self.store, key).bytes().to_bytes()
            except FileNotFoundError:
                return None

    def write(self, key: str, data: bytes) -> None:
        import obstore

        with self._errors(key):
            obstore.put(self.store, key, data)

    def create(self, key: str, data: bytes) -> str | None:
        import obstore

        with self._errors(key):
            try:
                return obstore.put(self.store, key, data, mode="create")["e_tag"]
            except obstore.exceptions.AlreadyExistsError:
                return None

    def replace(self, key: str, data: bytes, version: str | int) -> str | None:
        import obstore

        with self._errors(key):
            try:
                return obstore.put(self.store, key, data, mode={"e_tag": str(version)})["e_tag"]
            except (obstore.exceptions.PreconditionError, FileNotFoundError):
                return None

    def delete(self, key: str) -> None:
        import obstore

        with self._errors(key), contextlib.suppress(FileNotFoundError):
            obstore.delete(self.store, key)

    def delete_prefix(self, prefix: str) -> None:
        import obstore

        keys = list(self.listing(prefix))
        with self._errors(prefix or "/"):
            for first in range(0, len(keys), 1000):
                obstore.delete(self.store, keys[first:first + 1000])

    def info(self, key: str) -> ObjectInfo | None:
        import obstore

        with self._errors(key):
            try:
                meta = obstore.head(self.store, key)
            except FileNotFoundError:
                return None
        return ObjectInfo(meta["size"], meta["e_tag"] or "")

    def listing(self, prefix: str = "") -> dict[str, ObjectInfo]:
        import obstore

        with self._errors(prefix or "/"):
            return {meta["path"]: ObjectInfo(meta["size"], meta["e_tag"] or "")
                    for batch in obstore.list(self.store, prefix=prefix or None,
                                              chunk_size=1000)
                    for meta in batch}

    def any_key(self, prefix: str = "") -> bool:
        import obstore

        with self._errors(prefix or "/"):
            for batch in obstore.list(self.store, prefix=prefix or None, chunk_size=1):
                if batch:
                    return True
        return False

    def _map(self, function, keys: list[str]) -> list:
        if len(keys) < 2:
            return [function(key) for key in keys]
        with ThreadPoolExecutor(min(PARALLEL, len(keys))) as pool:
            return list(pool.map(function, keys))

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        """obstore's errors as one line naming the URL, the problem and the fix."""
        try:
            yield
        except (FileNotFoundError, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - obstore raises many kinds; mapped below
            raise describe_object_error(self.ref, key, error) from None


def describe_object_error(ref: StoreRef, key: str, error: BaseException) -> Exception:
    """An obstore (or s3fs) error as InputError / StoreUnreachable with one line: which URL,
    what went wrong, what to do. Never quotes credentials (the error text holds none: requests
    are signed, not authenticated by URL)."""
    import obstore

    text = str(error)
    where = f"store {ref.url}"
    if isinstance(error, obstore.exceptions.PermissionDeniedError | PermissionError) or any(
            code in text for code in ("AccessDenied", "InvalidAccessKeyId",
                                      "SignatureDoesNotMatch", "403 Forbidden",
                                      "ExpiredToken", "Unauthenticated", "401 Unauthorized")):
        return StoreUnreachable(
            f"{where}: access denied (wrong or missing credentials); set the store's credentials "
            f"in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or the "
            f"machine's role) and check they may read and write {ref.url}")
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        bucket = urlsplit(ref.url).netloc
        return InputError(f"{where}: bucket {bucket!r} does not exist; create it first, or fix "
                          f"the URL")
    if any(word in text for word in ("error sending request", "Connection refused",
                                     "dns error", "timed out", "connect error",
                                     "ConnectTimeout", "Could not connect")):
        endpoint = ref.option_dict.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL") \
            or "the provider's default endpoint"
        return StoreUnreachable(f"{where}: the endpoint {redact_url(endpoint)} does not answer; "
                                f"check the endpoint URL (storage_options.endpoint_url or "
                                f"AWS_ENDPOINT_URL) and the network")
    first = redact_url(" ".join(text.split()))[:200]
    return StoreUnreachable(f"{where}: {type(error).__name__} on {key}: {first}")


class FsspecLocation(ObjectLocation):
    """An S3 store through fsspec (s3fs): zarr's `FsspecStore` for the data, s3fs's calls for
    the bookkeeping (conditional writes by S3's If-None-Match / If-Match headers)."""

    def __init__(self, ref: StoreRef, fs: Any, fs_options: dict[str, Any]) -> None:
        self.ref = ref
        self.fs = fs  # synchronous, on fsspec's own loop: the bookkeeping
        self.fs_options = fs_options
        parts = urlsplit(ref.url)
        self.root = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")

    def zarr_store(self, *, read_only: bool = False) -> Any:
        from zarr.storage import FsspecStore

        # zarr runs an asynchronous filesystem of its own on its event loop
        return FsspecStore.from_url(f"s3://{self.root}", storage_options=self.fs_options,
                                    read_only=read_only)

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, rest = self._full(key).partition("/")
        return bucket, rest

    def read(self, key: str) -> bytes | None:
        with self._errors(key):
            try:
                return self.fs.cat_file(self._full(key))
            except FileNotFoundError:
                return None

    def write(self, key: str, data: bytes) -> None:
        with self._errors(key):
            self.fs.pipe_file(self._full(key), data)

    def create(self, key: str, data: bytes) -> str | None:
        bucket, name = self._bucket_key(key)
        return self._put(key, Bucket=bucket, Key=name, Body=data, IfNoneMatch="*")

    def replace(self, key: str, data: bytes, version: str | int) -> str | None:
        bucket, name = self._bucket_key(key)
        return self._put(key, Bucket=bucket, Key=name, Body=data, IfMatch=str(version))

    def _put(self, key: str, **kwargs: Any) -> str | None:
        with self._errors(key):
            try:
                out = self.fs.call_s3("put_object", **kwargs)
            except (FileExistsError, FileNotFoundError):
                return None
            except OSError as error:
                if any(word in str(error) for word in ("PreconditionFailed", "pre-condition")):
                    return None
                raise
            self.fs.invalidate_cache(self._full(key))
            return out["ETag"]

    def delete(self, key: str) -> None:
        with self._errors(key), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._full(key))

    def delete_prefix(self, prefix: str) -> None:
        keys = [self._full(key) for key in self.listing(prefix)]
        with self._errors(prefix or "/"):
            if keys:
                self.fs.rm(keys)

    def info(self, key: str) -> ObjectInfo | None:
        with self._errors(key):
            try:
                meta = self.fs.info(self._full(key), refresh=True)
            except FileNotFoundError:
                return None
        return ObjectInfo(int(meta["size"]), meta.get("ETag", ""))

    def listing(self, prefix: str = "") -> dict[str, ObjectInfo]:
        with self._errors(prefix or "/"):
            self.fs.invalidate_cache(self.root)
            found = self.fs.find(self._full(prefix), detail=True)
        cut = len(self.root) + 1
        return {name[cut:]: ObjectInfo(int(meta["size"]), meta.get("ETag", ""))
                for name, meta in found.items() if meta.get("type") != "directory"}

    def any_key(self, prefix: str = "") -> bool:
        with self._errors(prefix or "/"):
            self.fs.invalidate_cache(self.root)
            return bool(self.fs.find(self._full(prefix), maxdepth=None, withdirs=False))


_MEMORY: dict[str, Any] = {}  # memory:// stores of this process, by URL
_MEMORY_LOCK = threading.Lock()


def _obstore_location(ref: StoreRef) -> ObjectLocation:
    try:
        import obstore.store as stores
    except ImportError:
        raise _missing(ref, "obstore") from None
    if ref.scheme == MEMORY_SCHEME:
        with _MEMORY_LOCK:
            store = _MEMORY.setdefault(ref.url.rstrip("/"), stores.MemoryStore())
        return ObjectLocation(ref, store)
    options = ref.option_dict
    provider = OBJECT_SCHEMES[ref.scheme]
    kwargs: dict[str, Any] = {}
    client: dict[str, Any] = {}
    if options.get("endpoint_url"):
        kwargs["endpoint"] = options["endpoint_url"]
    endpoint = options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL", "")
    if endpoint.startswith("http://"):
        client["allow_http"] = True
    if options.get("region"):
        kwargs["region"] = options["region"]
    if options.get("anon"):
        kwargs["skip_signature"] = True
    if options.get("profile"):
        kwargs["credential_provider"] = _profile_credentials(ref, options["profile"])
    if provider == "s3" and "region" not in kwargs and not os.environ.get("AWS_REGION") \
            and not os.environ.get("AWS_DEFAULT_REGION") and endpoint:
        kwargs["region"] = "us-east-1"  # S3-compatible servers ignore it; signing needs one
    try:
        store = stores.from_url(ref.url, client_options=client or None,
                                retry_config=RETRIES,
                                **kwargs)
    except Exception as error:  # noqa: BLE001 - a bad URL or option: one line
        raise InputError(f"store {ref.url}: {redact_url(' '.join(str(error).split()))[:200]}"
                         ) from None
    return ObjectLocation(ref, store)


def _profile_credentials(ref: StoreRef, profile: str) -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise _missing(ref, "boto3", why="storage_options.profile") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))


def _fsspec_location(ref: StoreRef) -> FsspecLocation:
    if OBJECT_SCHEMES.get(ref.scheme) != "s3":
        raise InputError(f"store {ref.url}: backend fsspec serves s3:// stores only; use "
                         f"backend: obstore")
    try:
        import s3fs
    except ImportError:
        raise _missing(ref, "s3fs") from None
    options = ref.option_dict
    client: dict[str, Any] = {}
    if options.get("endpoint_url"):
        client["endpoint_url"] = options["endpoint_url"]
    if options.get("region"):
        client["region_name"] = options["region"]
    fs_options = {"anon": bool(options.get("anon")), "profile": options.get("profile"),
                  "client_kwargs": client}
    fs = s3fs.S3FileSystem(**fs_options, skip_instance_cache=True)
    return FsspecLocation(ref, fs, fs_options)


def _missing(ref: StoreRef, package: str, why: str | None = None) -> EnvironmentFault:
    provider = OBJECT_SCHEMES.get(ref.scheme)
    extra = PROVIDER_EXTRAS.get(provider or "", "s3")
    return EnvironmentFault(
        f"store {ref.url}: {why or 'this store'} needs the package {package!r}, which is not "
        f"installed; pip install 'dobrushin-sweep[{extra}]' (or pip install {package})"
    )


def check_endpoint_variables() -> None:
    """InputError if an endpoint URL in the environment (AWS_ENDPOINT_URL...) carries
    credentials: the S3 clients would send them, and messages would quote them."""
    for name in ENDPOINT_VARIABLES:
        check_no_userinfo(os.environ.get(name, ""), name)


@functools.lru_cache(maxsize=64)
def _locate(ref: StoreRef) -> Location:
    check_url(ref.url)
    if ref.is_local:
        return LocalLocation(ref)
    check_endpoint_variables()
    if ref.option_dict.get("backend") == "fsspec":
        return _fsspec_location(ref)
    return _obstore_location(ref)


def locate(store: StoreLike, options: Mapping[str, Any] | None = None) -> Location:
    """The `Location` of a store given as a path, a URL, a StoreRef or a Location (one client
    per store and process, reused)."""
    if isinstance(store, Location):
        return store
    return _locate(StoreRef.of(store, options))


def forget_memory_stores() -> None:
    """Drop this process's memory:// stores (tests)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()
    _locate.cache_clear()
