fn main() {
    println!("cargo:rerun-if-changed=proto/locus.proto");
    // protox compiles the .proto in pure Rust, so the build needs no protoc from apt.
    let fds = protox::compile(["proto/locus.proto"], ["proto"]).expect("compile proto");
    tonic_prost_build::configure().compile_fds(fds).expect("generate code");
}
