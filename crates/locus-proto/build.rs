fn main() {
    println!("cargo:rerun-if-changed=proto/locus.proto");
    // protox compiles the .proto in pure Rust, so the build needs no protoc from apt.
    let fds = protox::compile(["proto/locus.proto"], ["proto"]).expect("compile proto");
    tonic_prost_build::configure()
        // Cloned by a retry: shared, not copied.
        .bytes(".locus.v1.ImportCatalogRequest.batch")
        .bytes(".locus.v1.InventoryChunk.data")
        // Small maps in key order: an entry encodes to the same bytes every time.
        .btree_map(".locus.v1.CatalogEntry")
        .compile_fds(fds)
        .expect("generate code");
}
