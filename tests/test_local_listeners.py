"""Issue 34, item 1: the local cluster `sweep run` starts listens on loopback only. Every
listener it opens (scheduler, each worker's and nanny's comm listener, the worker's and the
scheduler's HTTP servers) is read back twice: from the operating system (psutil: sockets of
this process and its children in LISTEN state, opened since the test began) and from Dask
(the addresses the scheduler knows)."""

from __future__ import annotations

import io
import ipaddress
from pathlib import Path

import psutil
import pytest
from distributed.comm import get_address_host

from sweep.clusters.client import load_cluster_config, open_client


def listening() -> set[tuple[int, str, int]]:
    """(pid, host, port) of every LISTEN socket of this process and its children."""
    me = psutil.Process()
    out = set()
    for process in [me, *me.children(recursive=True)]:
        try:
            sockets = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out |= {(process.pid, s.laddr.ip, s.laddr.port) for s in sockets
                if s.status == psutil.CONN_LISTEN}
    return out


def dask_addresses(client) -> dict[str, str]:
    """Every comm and HTTP address the cluster reports, by who listens there."""
    info = client.scheduler_info(n_workers=-1)
    out = {"scheduler": client.scheduler.address}
    for address, worker in info["workers"].items():
        out[f"worker {worker['name']}"] = address
        if worker.get("nanny"):
            out[f"nanny {worker['name']}"] = worker["nanny"]
    out |= {f"worker http {address}": f"tcp://{host}:0" for address, host in client.run(
        lambda dask_worker: dask_worker.http_server.address).items()}
    out["scheduler http"] = "tcp://{}:0".format(client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.http_server.address))
    return out


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host.strip("[]")).is_loopback


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_the_default_local_cluster_listens_on_loopback_only(tmp_path: Path, workers: str):
    before = listening()
    if workers == "threads":
        cfg = load_cluster_config(None)  # what `sweep run` starts without --cluster
    else:
        path = tmp_path / "cluster.yaml"
        path.write_text("local: {processes: true}\n")
        cfg = load_cluster_config(path)
    with open_client(cfg, out=io.StringIO()) as client:
        client.wait_for_workers(1)
        sockets = listening() - before
        reported = dask_addresses(client)
    assert sockets, "the cluster opened no listener at all"
    if workers == "processes":
        assert any(pid != psutil.Process().pid for pid, _, _ in sockets), sockets
    open_ports = [(pid, host, port) for pid, host, port in sockets if not is_loopback(host)]
    assert not open_ports, f"listening off loopback: {open_ports}"
    open_dask = {who: address for who, address in reported.items()
                 if not is_loopback(get_address_host(address))}
    assert not open_dask, f"Dask reports listeners off loopback: {open_dask}"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own authority, and its key (PEM files)."""
    x509 = pytest.importorskip("cryptography.x509")
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "sweep-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_the_local_cluster_speaks_tls_when_dasks_configuration_requires_it(tmp_path: Path):
    """What docs/faults.md tells a user who binds another host: Dask's TLS settings reach the
    scheduler, every worker and the client, and a task runs over them."""
    import dask

    cert, key = self_signed(tmp_path)
    pair = {"cert": str(cert), "key": str(key)}
    settings = {"distributed.comm.require-encryption": True,
                "distributed.comm.tls.ca-file": str(cert),
                "distributed.comm.tls.scheduler": pair, "distributed.comm.tls.worker": pair,
                "distributed.comm.tls.client": pair}
    path = tmp_path / "cluster.yaml"
    path.write_text("local: {processes: true, pools: {p: {workers: 1, resources: "
                    "{GPU: 1, CPU: 1}}}}\n")
    with dask.config.set(settings), open_client(load_cluster_config(path),
                                                out=io.StringIO()) as client:
        client.wait_for_workers(1)
        addresses = dask_addresses(client)
        assert client.submit(sum, [1, 2]).result() == 3
    comms = {who: a for who, a in addresses.items() if "http" not in who}
    assert all(a.startswith("tls://127.0.0.1:") for a in comms.values()), comms


def test_a_host_in_the_cluster_file_reaches_every_listener():
    from sweep.clusters.config import LocalConfig, LocalPool
    from sweep.clusters.local import bound_dashboard, worker_specs

    assert LocalConfig().host == "127.0.0.1"
    pools = {"p": LocalPool(workers=2, resources={"GPU": 1, "CPU": 1})}
    for processes in (True, False):
        specs = worker_specs(pools, "1GB", processes, host="10.1.2.3")
        assert {spec["options"]["host"] for spec in specs.values()} == {"10.1.2.3"}
    assert bound_dashboard(":8787", "127.0.0.1") == "127.0.0.1:8787"
    assert bound_dashboard("8787", "::1") == "[::1]:8787"
    assert bound_dashboard("0.0.0.0:8787", "127.0.0.1") == "0.0.0.0:8787"  # asked for


def test_a_local_cluster_off_loopback_without_tls_is_warned_about():
    import dask

    from sweep.clusters.config import ClusterConfig, LocalConfig
    from sweep.clusters.local import exposure_warning

    assert exposure_warning(ClusterConfig()) is None
    assert exposure_warning(ClusterConfig(local=LocalConfig(host="::1"))) is None
    line = exposure_warning(ClusterConfig(local=LocalConfig(host="10.1.2.3")))
    assert line is not None and "10.1.2.3 without TLS" in line and "docs/faults.md" in line
    with dask.config.set({"distributed.comm.require-encryption": True}):
        assert exposure_warning(ClusterConfig(local=LocalConfig(host="10.1.2.3"))) is None
