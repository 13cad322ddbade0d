"""The Locus client for Python.

``locus.Client`` is the native client (``locus._native``, a pyo3 binding over the Rust
client: short-circuit reads from a worker on this host, the write pipeline with its
write types). ``locus.fsspec.LocusFileSystem`` is the ``locus://`` filesystem for fsspec,
pandas and PyArrow, registered through fsspec's entry point::

    import pandas as pd
    df = pd.read_csv("locus:///data/x.csv")            # master from LOCUS_MASTER
    df = pd.read_csv("locus://10.0.0.5:19998/data/x.csv")
"""

from ._native import Client, Reader, Writer, __version__

__all__ = ["Client", "Reader", "Writer", "LocusFileSystem", "__version__"]


def __getattr__(name):
    # fsspec is imported only when the filesystem is wanted.
    if name == "LocusFileSystem":
        from .fsspec import LocusFileSystem

        return LocusFileSystem
    raise AttributeError(name)
