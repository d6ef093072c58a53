"""The lock of a store on object storage: a lease that its holder renews and that expires.

Object stores have no `flock`: a driver killed with SIGKILL leaves nothing the server would
release. So the lock is a lease, an object `.sweep/lease/<generation>.json` holding who holds it
(user, host, pid, a run id) and until when (`expires`, renewed every `ttl / 4` by a thread of the
running driver). Generations make taking over safe without a conditional delete: a run takes
generation g + 1 with a conditional create (S3 `If-None-Match: *`, GCS's generation
precondition; `Location.create`), which exactly one of several racing runs wins. The holder's
renewals are conditional on the ETag of its own last write (`Location.replace`), so a holder whose
lease was broken finds out at its next renewal instead of renewing over the new holder.

A second run is refused while the newest generation is fresh, naming its holder; an expired one
(its driver was killed, or lost the network) is taken over, saying so, and so is, at once, a
fresh one whose holder ran on this host and has exited (`holder_has_exited`: the same host name
and process namespace, and its pid gone or now another process's); `break_lock` takes over a
lease that has missed two renewals before it expires, and `force` takes over even a fresh one.
Expiry compares the holder's clock with the reader's: hosts are assumed to keep time (NTP) to
well within `ttl`.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import psutil

from storage.errors import InputError
from storage.layout import BOOKKEEPING_DIR
from storage.location import Location, redact_url

LEASES = f"{BOOKKEEPING_DIR}/lease/"
TTL_ENV = "DOBRUSHIN_LEASE_SECONDS"
DEFAULT_TTL = 120.0  # seconds a lease lives without a renewal; renewed every ttl / 4
START_SLACK = 1.0  # seconds two readings of one process's start time may differ by


class StoreBusyError(InputError):
    """Another process holds the store's lock."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease object holds."""

    holder: str
    host: str
    pid: int
    run: str
    renewed: float  # epoch seconds of the holder's last write
    expires: float  # epoch seconds
    released: bool = False
    started: float | None = None  # the holder process's start (epoch s): tells a reused pid
    namespace: str | None = None  # the holder's pid namespace (Linux), None elsewhere

    def describe(self, now: float) -> str:
        """`user@host pid N, renewed 3 s ago`."""
        return f"{self.holder} pid {self.pid}, renewed {max(0.0, now - self.renewed):.0f} s ago"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord | None:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None


def pid_namespace() -> str | None:
    """This process's pid namespace (`pid:[4026531836]` on Linux), None where there is none: two
    containers on one host may share its host name but not their pids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def holder_has_exited(record: LeaseRecord) -> bool:
    """Whether the lease's holder ran on this host (same host name and pid namespace) and its
    process is gone: no process has its pid, or the one that has it started at another time
    (the pid was reused), or it is a zombie. False whenever that cannot be told: another host
    or namespace, or a record written before holders recorded their start time."""
    if record.started is None or record.host != socket.gethostname() \
            or record.namespace != pid_namespace():
        return False
    try:
        process = psutil.Process(record.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        return abs(process.create_time() - record.started) > START_SLACK
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to inspect: assume it lives
        return False


def _own_start() -> float:
    return psutil.Process().create_time()


def lease_ttl() -> float:
    """The lease's time to live: DOBRUSHIN_LEASE_SECONDS, else DEFAULT_TTL."""
    value = os.environ.get(TTL_ENV)
    try:
        ttl = float(value) if value else DEFAULT_TTL
    except ValueError:
        raise InputError(f"{TTL_ENV}={value!r}: not a number of seconds") from None
    if ttl <= 0:
        raise InputError(f"{TTL_ENV}={value!r}: must be positive")
    return ttl


def _key(generation: int) -> str:
    return f"{LEASES}{generation:010d}.json"


def _generation(key: str) -> int | None:
    name = key[len(LEASES):].removesuffix(".json")
    return int(name) if name.isdigit() else None


class Lease:
    """Take (`acquire`), keep (a renewing thread) and give back (`release`) a store's lease."""

    def __init__(self, location: Location, *, ttl: float | None = None) -> None:
        self.location = location
        self.ttl = lease_ttl() if ttl is None else ttl
        self.interval = self.ttl / 4
        self.run = uuid.uuid4().hex
        self.generation: int | None = None
        self.version: str | int | None = None
        self.lost: LeaseRecord | str | None = None  # set when a renewal finds it was broken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self, *, released: bool = False) -> LeaseRecord:
        now = time.time()
        host = socket.gethostname()
        return LeaseRecord(f"{getpass.getuser()}@{host}", host, os.getpid(), self.run, now,
                           now if released else now + self.ttl, released, _own_start(),
                           pid_namespace())

    def _newest(self) -> tuple[int, LeaseRecord | None]:
        """The newest generation and its record (0, None when there is none)."""
        generations = [g for key in self.location.listing(LEASES)
                       if (g := _generation(key)) is not None]
        if not generations:
            return 0, None
        newest = max(generations)
        data = self.location.read(_key(newest))
        return newest, None if data is None else LeaseRecord.decode(data)

    def acquire(self, *, break_lock: bool = False, force: bool = False) -> None:
        """Take the lease, or raise StoreBusyError naming its holder (see the module)."""
        for _ in range(3):  # a race lost to another run: look again
            generation, current = self._newest()
            now = time.time()
            if current is None and generation and not break_lock:
                data = self.location.read(_key(generation))
                if data is not None:  # there, but not a lease record: whose is it?
                    raise StoreBusyError(
                        f"store {self.location}: its lease {_key(generation)} cannot be read "
                        f"(not a lease record), so whether another run holds it is unknown; "
                        f"make sure none does, then rerun with --break-lock")
            if current is not None and not current.released:
                self._check_can_take(current, now, break_lock=break_lock, force=force)
            version = self.location.create(_key(generation + 1), self._record().encode())
            if version is None:  # lost the race, or our own create landed and was retried
                version = self._own_version(generation + 1)
            if version is not None:
                self.generation, self.version = generation + 1, version
                self._forget_older(generation + 1)
                self._start()
                return
        raise StoreBusyError(f"store {self.location}: other runs keep taking its lease; wait "
                             f"for them to finish, then rerun")

    def _check_can_take(self, current: LeaseRecord, now: float, *, break_lock: bool,
                        force: bool) -> None:
        who = current.describe(now)
        if now > current.expires:
            print(f"sweep: store {self.location}: taking over the expired lease of {who} "
                  f"(expired {now - current.expires:.0f} s ago: that run is gone)",
                  file=sys.stderr)
            return
        if holder_has_exited(current):
            print(f"sweep: store {self.location}: taking over the lease of {who}: that process "
                  f"has exited (on this host, {current.host}), so its run is gone",
                  file=sys.stderr)
            return
        stale = now - current.renewed > 2 * self.interval
        if break_lock and (stale or force):
            print(f"sweep: store {self.location}: breaking the lease of {who}", file=sys.stderr)
            return
        if break_lock:
            raise StoreBusyError(
                f"store {self.location}: its lease is fresh ({who}, expires in "
                f"{current.expires - now:.0f} s): that run looks alive; stop it first, or add "
                f"--force to break the lease anyway")
        raise StoreBusyError(
            f"store {self.location} is in use by another sweep run ({who}, expires in "
            f"{current.expires - now:.0f} s); wait for it to finish or stop it, then rerun (a "
            f"killed run's lease expires by itself; --break-lock takes over a stale one)")

    def _own_version(self, generation: int) -> str | int | None:
        """The version of generation `generation`'s object if this run wrote it and no newer
        generation exists: a conditional write whose reply was lost is retried by the client
        and refused (412) although it landed; None otherwise."""
        newest, record = self._newest()
        info = self.location.info(_key(generation))
        if newest != generation or record is None or record.run != self.run or info is None:
            return None
        return info.version

    def _forget_older(self, generation: int) -> None:
        for key in self.location.listing(LEASES):
            found = _generation(key)
            if found is not None and found < generation:
                self.location.delete(key)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._keep, name="sweep-lease", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Extend the lease; False (and `lost` set) if another run broke it meanwhile. A
        renewal the server refused because this run's own retried write had landed keeps the
        lease; a network error is retried at the next interval. Never raises."""
        if self.generation is None or self.lost is not None:
            return False
        try:
            version = self.location.replace(_key(self.generation), self._record().encode(),
                                            self.version)
            if version is None:
                version = self._own_version(self.generation)
        except Exception as error:  # noqa: BLE001 - a network blip: try again next interval
            print(f"sweep: could not renew the lease of store {self.location} "
                  f"({redact_url(str(error))}); retrying", file=sys.stderr)
            return True
        if version is None:
            try:
                _, taker = self._newest()
            except Exception:  # noqa: BLE001 - the lease is lost either way; name who if we can
                taker = None
            self.lost = taker or "another run"
            who = taker.describe(time.time()) if taker else "another run"
            print(f"sweep: store {self.location}: this run's lease was broken by {who}",
                  file=sys.stderr)
            return False
        self.version = version
        return True

    def release(self) -> None:
        """Stop renewing and mark the lease released (the next run takes it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.generation is not None and self.lost is None:
            self.location.replace(_key(self.generation), self._record(released=True).encode(),
                                  self.version)
        self.generation = None
