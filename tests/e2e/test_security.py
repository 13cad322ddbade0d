"""An authenticated cluster, tried with the real binary: clients without the cluster's
client token are refused (exit 5, one line saying what to fix), the credential files and
the metadata are this user's only, and a mount's UFS credentials given through
--option-file or --option-env never show in `ps`, in a log, or in any client's answer.
With TLS on (certificates made here with `cryptography`), everything goes over TLS and a
plain client, a client trusting another CA, or a TLS client of a plain cluster is refused
at once with one line saying why. The web port needs the client token."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import boto3
from conftest import LOCUS_BIN, Locus, MinioServer, assert_one_line_error, clean_env, gw_client, sha256

# A MinIO whose keys appear nowhere but in the option file and one variable.
MINIO_USER, MINIO_PASSWORD = "sec-user-4e1b", "Sec-Password-Only-In-A-File-7f3a"


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_credentials_and_metadata_are_private_files(cluster):
    d = cluster.data_dir
    assert mode(d / "cluster.secret") == 0o600
    assert mode(d / "client.token") == 0o600
    assert mode(d / "master") == 0o700
    assert mode(d / "master" / "meta.redb") == 0o600
    assert mode(d / "worker0") == 0o700
    secret, token = (d / "cluster.secret").read_text().strip(), (d / "client.token").read_text().strip()
    assert len(secret) >= 32 and len(token) >= 32 and secret != token
    for log in cluster.log_paths:
        text = log.read_text(errors="replace")
        assert secret not in text and token not in text, f"a credential is in {log}"


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=30)


def test_another_local_user_reads_nothing(cluster_factory, tmp):
    """`local start` makes its data dir and the default UFS 0700 and persisted files
    0600: the user `nobody` reads none of it, even where every directory above is open."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("acting as the user nobody needs root and runuser")
    base, c = Path(tempfile.mkdtemp(prefix="locus-modes-", dir="/tmp")), None
    try:
        base.chmod(0o755)  # open to everyone: only Locus's own modes stand in the way
        c = cluster_factory(name=str(base / "data"))
        c.ok("fs", "put", "-", "/p.txt", input=b"private bytes")
        c.ok("fs", "persist", "/p.txt")
        ufs, f = c.data_dir / "ufs", c.data_dir / "ufs" / "p.txt"
        assert (mode(c.data_dir), mode(ufs), mode(f)) == (0o700, 0o700, 0o600)
        assert f.read_bytes() == b"private bytes"
        for cmd in (["ls", str(c.data_dir)], ["cat", str(f)], ["cat", str(c.data_dir / "client.token")]):
            r = _as_nobody(*cmd)
            assert r.returncode != 0 and "Permission denied" in r.stderr, (cmd, r)
        # Each layer holds on its own: with the directories opened, the file still refuses.
        c.data_dir.chmod(0o755)
        ufs.chmod(0o755)
        r = _as_nobody("cat", str(f))
        assert r.returncode != 0 and "Permission denied" in r.stderr, r
        assert _as_nobody("ls", str(ufs)).returncode == 0, "the directories were opened: the check is real"
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_clients_without_the_token_are_refused(cluster, tmp):
    cluster.ok("fs", "put", "-", "/t.txt", input=b"with the token")
    # No token anywhere: the CLI says where it looked.
    r = subprocess.run([str(LOCUS_BIN), "--master", cluster.master, "fs", "cat", "/t.txt"], cwd=tmp,
                       capture_output=True, env=clean_env(), timeout=60)
    line = assert_one_line_error(r, 5)
    assert "client token" in line and "LOCUS_SECURITY__TOKEN_FILE" in line, line
    # Another cluster's token: the master refuses it.
    wrong = tmp / "wrong.token"
    wrong.write_text("0123456789abcdef" * 4)
    wrong.chmod(0o600)
    r = cluster.run("fs", "cat", "/t.txt", env={"LOCUS_SECURITY__TOKEN_FILE": str(wrong)})
    line = assert_one_line_error(r, 5)
    assert "refused" in line and "token" in line, line
    # --token-file works as the variable does; the right token reads.
    r = subprocess.run([str(LOCUS_BIN), "--master", cluster.master, "--token-file", str(cluster.token_file),
                        "fs", "cat", "/t.txt"], cwd=tmp, capture_output=True, env=clean_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"with the token"


def test_mount_credentials_stay_out_of_ps_logs_and_answers(cluster, tmp):
    minio = MinioServer(tmp / "minio-sec", tmp / "minio-sec.log", MINIO_USER, MINIO_PASSWORD)
    minio.start()
    try:
        _mount_with_hidden_credentials(cluster, minio, tmp)
    finally:
        minio.stop()


def _mount_with_hidden_credentials(cluster, minio, tmp):
    s3 = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=MINIO_USER,
                      aws_secret_access_key=MINIO_PASSWORD, region_name="us-east-1")
    bucket = "sec"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k.bin", Body=b"behind credentials")
    opts = tmp / "s3.options"
    opts.write_text(f"# MinIO\naccess_key_id={MINIO_USER}\nsecret_access_key={MINIO_PASSWORD}\n")
    opts.chmod(0o600)
    # --option-file, while another process watches what `ps` would show.
    p = cluster.popen("fs", "mount", "/sec", f"s3://{bucket}", "--option", f"endpoint={minio.endpoint}",
                      "--option-file", opts)
    cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert MINIO_PASSWORD.encode() not in cmdline
    assert sha256(cluster.cat("/sec/k.bin")) == sha256(b"behind credentials")
    # --option-env reads the value from this command's environment.
    r = cluster.run("fs", "mount", "/sec2", f"s3://{bucket}", "--option", f"endpoint={minio.endpoint}",
                    "--option", f"access_key_id={MINIO_USER}", "--option-env", "secret_access_key=S3_SECRET",
                    env={"S3_SECRET": MINIO_PASSWORD})
    assert r.returncode == 0, r.stderr
    assert cluster.cat("/sec2/k.bin") == b"behind credentials"
    r = cluster.run("fs", "mount", "/sec3", f"s3://{bucket}", "--option-env", "secret_access_key=NOT_SET_ANYWHERE")
    line = assert_one_line_error(r, 2)
    assert "NOT_SET_ANYWHERE" in line, line

    # No client answer carries the secret: the mount listing, the report, the status page.
    listing = cluster.ok("fs", "mount", "--json").decode()
    report = cluster.ok("report", "--json").decode()
    assert "/sec" in listing and '"***"' in listing, listing
    for what, text in [("mount listing", listing), ("report", report), ("metrics", cluster.metrics())]:
        assert MINIO_PASSWORD not in text, f"the UFS secret is in the {what}"
    # Nor any log line of the cluster.
    for log in cluster.log_paths:
        assert MINIO_PASSWORD not in log.read_text(errors="replace"), f"the UFS secret is in {log}"


# --------------------------------------------------------------------------- TLS


def make_tls(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for localhost and 127.0.0.1, as PEM files
    in `d`: (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("locus e2e CA")).issuer_name(name("locus e2e CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(name("locus e2e server")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1]).add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (d / "ca.pem", d / "cert.pem", d / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def refused_quickly(c, *args, env=None, client=None) -> str:
    """Run a client command that must fail at once with exit 5; its one-line error."""
    t = time.monotonic()
    r = (client or c).run(*args, env=env, timeout=60)
    line = assert_one_line_error(r, 5)
    assert time.monotonic() - t < 10, f"refused only after {time.monotonic() - t:.1f} s: {line}"
    return line


def test_a_tls_cluster_serves_and_refuses_clearly(cluster_factory, tmp):
    ca, cert, key = make_tls(tmp / "tls")
    c = cluster_factory(workers=2, env={"LOCUS_SECURITY__TLS_CERT_FILE": str(cert),
                                        "LOCUS_SECURITY__TLS_KEY_FILE": str(key),
                                        "LOCUS_SECURITY__TLS_CA_FILE": str(ca)},
                        client_env={"LOCUS_SECURITY__TLS_CA_FILE": str(ca)})
    assert f"master rpc   {c.master} (TLS)" in c.log_paths[-1].read_text(), c.log_tail()
    # Master RPCs and the data path (--remote: no short-circuit) over TLS.
    data = os.urandom(9 << 20) + b"tail"
    c.ok("fs", "put", "-", "/tls/f.bin", input=data)
    assert sha256(c.cat("/tls/f.bin", "--remote")) == sha256(data)
    assert c.report()["live_workers"] == 2
    # The gateway in `local start` is a client too: its reads and writes go over TLS.
    s3 = gw_client(f"http://{c.gateway}")
    s3.put_object(Bucket="tls", Key="g.txt", Body=b"through the gateway")
    assert s3.get_object(Bucket="tls", Key="g.txt")["Body"].read() == b"through the gateway"
    assert c.cat("/tls/g.txt", "--remote") == b"through the gateway"
    # The CA given as a flag works as the variable does.
    flagged = Locus(c.master, token_file=c.token_file)
    assert flagged.ok("--tls-ca-file", ca, "fs", "--remote", "cat", "/tls/g.txt") == b"through the gateway"

    # A plain client (the right token, no CA) is told the cluster wants TLS.
    line = refused_quickly(c, "fs", "ls", "/", client=flagged)
    assert "TLS only" in line and "tls_ca_file" in line, line
    # A client trusting another CA fails its handshake, saying why.
    other_ca, _, _ = make_tls(tmp / "other")
    line = refused_quickly(c, "fs", "ls", "/", env={"LOCUS_SECURITY__TLS_CA_FILE": str(other_ca)})
    assert "TLS handshake" in line and "certificate" in line, line
    # The refusals are logged by the master; no credential is.
    text = "".join(p.read_text(errors="replace") for p in c.log_paths)
    assert "serves TLS only" in text and "TLS handshake failed" in text, text[-3000:]
    assert c.token_file.read_text().strip() not in text


def test_a_tls_client_of_a_plain_cluster_is_told_so(cluster, tmp):
    ca, _, _ = make_tls(tmp / "tls")
    line = refused_quickly(cluster, "fs", "ls", "/", env={"LOCUS_SECURITY__TLS_CA_FILE": str(ca)})
    assert "does not serve TLS" in line, line


def test_the_tls_flags_have_help():
    out = subprocess.run([str(LOCUS_BIN), "--help"], capture_output=True, env=clean_env(), timeout=30).stdout.decode()
    for flag in ["--tls-cert-file", "--tls-key-file", "--tls-ca-file"]:
        assert flag in out, out


def test_the_web_port_needs_the_client_token(cluster):
    for path in ["/", "/metrics", "/api/report"]:
        for auth in [None, "Bearer 0123456789abcdef0123456789abcdef", "Basic dXNlcjp3cm9uZy10b2tlbi13cm9uZw=="]:
            status, headers, body = cluster.web_get(path, auth=auth)
            assert status == 401, (path, auth, status, body)
            assert headers.get("www-authenticate") == 'Basic realm="locus"', headers
            assert "locus_workers_live" not in body and "live_workers" not in body, body
        for auth in ["bearer", "basic"]:
            status, _, body = cluster.web_get(path, auth=auth)
            assert status == 200, (path, auth, status, body)
    assert "locus_workers_live 1" in cluster.web_get("/metrics", auth="basic")[2]
    # `local start` says how to log in: where the token is.
    text = cluster.log_paths[-1].read_text()
    assert "web login" in text and str(cluster.token_file) in text, text
