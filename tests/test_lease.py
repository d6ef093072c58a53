"""The lease of an object store (storage.lease) over its own faults, on `memory://` stores: a
conditional write whose reply was lost and that the client retried (refused, though it landed)
keeps the lease; a renewal thread survives a failing listing; a run whose lease was broken
leaves the store to the run that took it."""

from __future__ import annotations

import uuid

import pytest

from storage.lease import Lease, StoreBusyError, _key
from storage.location import locate
from storage.lock import StoreLock


def fresh(name: str):
    return locate(f"memory://{name}-{uuid.uuid4().hex[:8]}")


def landed_but_refused(location, method: str) -> list[int]:
    """Make the next call of `method` do its write, then answer None (the 412 of a retry)."""
    calls, real = [], getattr(location, method)

    def once(*args):
        version = real(*args)
        if not calls:
            calls.append(1)
            assert version is not None  # it landed
            return None
        return version

    setattr(location, method, once)
    return calls


def test_a_renewal_refused_after_its_own_retried_write_landed_keeps_the_lease():
    location = fresh("renew")
    lease = Lease(location, ttl=60)
    lease.acquire()
    try:
        calls = landed_but_refused(location, "replace")
        assert lease.renew() and lease.lost is None and calls == [1]
        assert lease.renew() and lease.lost is None  # its version followed the landed write
        with pytest.raises(StoreBusyError, match="in use by another sweep run"):
            Lease(location, ttl=60).acquire()  # still fresh, still held
    finally:
        lease.release()


def test_a_create_refused_after_its_own_retried_write_landed_takes_the_lease():
    location = fresh("create")
    calls = landed_but_refused(location, "create")
    lease = Lease(location, ttl=60)
    lease.acquire()
    try:
        assert calls == [1] and lease.generation == 1
        assert lease.renew() and lease.lost is None
    finally:
        lease.release()


def test_a_broken_lease_is_found_even_when_a_listing_fails_first(capsys):
    location = fresh("broken")
    lease = Lease(location, ttl=60)
    lease.acquire()
    taker = Lease(location, ttl=60)
    location.delete(_key(1))  # as the taker's takeover does, after creating generation 2
    real_listing = location.listing

    def down(prefix: str = ""):
        raise OSError("network down")

    location.listing = down
    assert lease.renew() and lease.lost is None  # cannot tell yet: retried next interval
    assert "network down); retrying" in capsys.readouterr().err
    location.listing = real_listing
    taker.acquire()
    try:
        assert not lease.renew()
        assert lease.lost.run == taker.run
        assert "this run's lease was broken by" in capsys.readouterr().err
    finally:
        taker.release()
        lease.release()  # a lost lease is not written again


def test_a_run_whose_lease_was_broken_leaves_the_store_to_its_taker():
    """A run that created the store and then failed would remove it; not once its lease was
    taken: what is there is the other run's now."""
    location = fresh("store")
    with pytest.raises(RuntimeError, match="failed while planning"):
        with StoreLock(location) as lock:
            location.write("zarr.json", b'{"attributes": {}}')  # created, not finished
            taker = Lease(location, ttl=60)
            taker.acquire(break_lock=True, force=True)
            assert not lock.lease.renew() and lock.lost
            raise RuntimeError("failed while planning")
    try:
        assert location.read("zarr.json") is not None
        assert location.read(_key(taker.generation)) is not None
    finally:
        taker.release()


def test_an_unreadable_lease_record_is_not_taken_over_without_break_lock():
    """Garbage where the newest lease should be says nothing about its holder: refused, naming
    the object and the way out; --break-lock takes it."""
    location = fresh("garbage")
    location.write(_key(1), b"\x00not json")
    with pytest.raises(StoreBusyError, match="lease .*0000000001.json cannot be read .* "
                                             "--break-lock"):
        Lease(location, ttl=60).acquire()
    lease = Lease(location, ttl=60)
    lease.acquire(break_lock=True)
    try:
        assert lease.generation == 2
    finally:
        lease.release()


def test_a_local_create_is_whole_or_absent(tmp_path):
    """`create` on a folder links a finished temporary file into place: the name never holds
    fewer bytes than were written, and a second create of it is refused."""
    location = locate(str(tmp_path / "store"))
    assert location.create(".sweep/device/m", b"cuda\n") is not None
    assert location.create(".sweep/device/m", b"cpu\n") is None
    assert location.read(".sweep/device/m") == b"cuda\n"
    assert sorted(p.name for p in (tmp_path / "store" / ".sweep" / "device").iterdir()) == ["m"]
