fn main() {
    println!("cargo:rerun-if-changed=proto/locus.proto");
    println!("cargo:rerun-if-changed=proto/command.proto");
    // protox compiles the .proto in pure Rust, so the build needs no protoc from apt.
    let fds = protox::compile(["proto/locus.proto", "proto/command.proto"], ["proto"]).expect("compile proto");
    tonic_prost_build::configure()
        // Cloned by a retry: shared, not copied.
        .bytes(".locus.v1.ImportCatalogRequest.batch")
        .bytes(".locus.v1.InventoryChunk.data")
        // Small maps in key order: an entry encodes to the same bytes every time.
        .btree_map(".locus.v1.CatalogEntry")
        // Namespace records (and the commands that write them) encode alike on every
        // master: the same record, the same bytes.
        .btree_map(".locus.v1.ObjectMeta")
        .btree_map(".locus.v1.MountInfo.options")
        .btree_map(".locus.v1.RaftMembership.nodes")
        .compile_fds(fds)
        .expect("generate code");
}
