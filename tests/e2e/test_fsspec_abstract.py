"""fsspec's own conformance suite (`fsspec.tests.abstract`: copy, get, put, pipe and
open, with their trailing-slash, glob, maxdepth and list-of-paths cases) run against the
`locus://` filesystem of a real cluster, as fsspec runs it against its own
implementations. One cluster serves the module; each test works under a directory of its
own."""

from __future__ import annotations

import posixpath
import tempfile
import uuid
from pathlib import Path

import fsspec.tests.abstract as abstract
import pytest
from conftest import Cluster

locus = pytest.importorskip("locus", reason="the locus wheel is not installed (scripts/build-python-client)")


@pytest.fixture(scope="module")
def locus_cluster(e2e_tmp):
    d = Path(tempfile.mkdtemp(prefix="fsabs-", dir=e2e_tmp))
    c = Cluster(d / "c", d, workers=1, args=["--block-size", "8MiB"], env=None, client_env=None)
    c.start()
    try:
        yield c
    finally:
        c.cleanup()


class LocusFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, locus_cluster):
        from locus.fsspec import LocusFileSystem

        return LocusFileSystem(master=locus_cluster.master, token_file=str(locus_cluster.token_file),
                               skip_instance_cache=True)

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs):
        path = f"/fsspec-abstract/{uuid.uuid4().hex[:12]}"
        fs.makedirs(path, exist_ok=True)
        yield path
        fs.rm(path, recursive=True)

    @pytest.fixture
    def supports_empty_directories(self):
        return True


class TestLocusCopy(abstract.AbstractCopyTests, LocusFixtures):
    pass


class TestLocusGet(abstract.AbstractGetTests, LocusFixtures):
    pass


class TestLocusPut(abstract.AbstractPutTests, LocusFixtures):
    pass


class TestLocusPipe(abstract.AbstractPipeTests, LocusFixtures):
    pass


class TestLocusOpen(abstract.AbstractOpenTests, LocusFixtures):
    pass
