"""An authenticated cluster, tried with the real binary: clients without the cluster's
client token are refused (exit 5, one line saying what to fix), the credential files and
the metadata are this user's only, and a mount's UFS credentials given through
--option-file or --option-env never show in `ps`, in a log, or in any client's answer."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import boto3
from conftest import LOCUS_BIN, MinioServer, assert_one_line_error, clean_env, sha256

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
