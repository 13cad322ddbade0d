//! Opening the search index with its writer, and the import's floor: the same
//! documents into the same index with no master around it (`locus bench index-floor`).

use std::path::Path;

use locus_common::{Error, Result};
use locus_proto::pb;
use tantivy::{Index, IndexWriter};

use crate::directory::IndexDir;
use crate::index::{self, Fields, ix_err};

/// The index writer's memory (split over its threads) when none is configured
/// (`master.search_index_memory`).
pub const WRITER_HEAP: usize = 192 << 20;
/// The writer's threads.
pub const WRITER_THREADS: usize = 2;

/// The index in `dir` (made when there is none) and its writer, which holds at most
/// `heap` bytes of uncommitted changes.
pub fn open_index(dir: &Path, heap: usize) -> Result<(Index, IndexWriter)> {
    let files = IndexDir::open(dir).map_err(ix_err)?;
    // Small doc-store blocks: a page of hits reads entries scattered over the store.
    let settings = tantivy::IndexSettings { docstore_blocksize: 4096, ..Default::default() };
    let index = Index::builder().schema(index::schema()).settings(settings).open_or_create(files).map_err(|e| {
        Error::internal(format!("search index {}: {e} (remove the directory to rebuild it)", dir.display()))
    })?;
    let w = index.writer_with_num_threads(WRITER_THREADS, heap).map_err(ix_err)?;
    Ok((index, w))
}

/// The order an import batch is indexed in: by path, and of a path given more than
/// once only its last entry.
pub fn import_order(entries: &[(String, pb::CatalogEntry)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0).then(b.cmp(&a)));
    order.dedup_by(|b, a| entries[*a].0 == entries[*b].0);
    order
}

/// The import's floor (`locus bench index-floor`): the same documents into the same
/// index (schema, settings, writer threads and memory) in a fresh directory `dir`, with
/// no master around it: no RPC, no namespace check, no Bloom filters, one commit at the
/// end. Each batch is ordered as an import's is ([`import_order`]). Returns the
/// documents written. Blocking.
pub fn index_floor(dir: &Path, batches: impl Iterator<Item = Vec<(String, pb::CatalogEntry)>>) -> Result<u64> {
    locus_common::security::create_private_dir(dir)?;
    let (index, mut w) = open_index(dir, WRITER_HEAP)?;
    let f = Fields::of(&index.schema())?;
    let mut n = 0;
    for batch in batches {
        for i in import_order(&batch) {
            w.add_document(f.doc(&batch[i].0, &batch[i].1)).map_err(ix_err)?;
            n += 1;
        }
    }
    w.commit().map_err(ix_err)?;
    Ok(n)
}
