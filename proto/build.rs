//! Compiles the .proto files with protox (pure Rust), so building needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/wire.proto",
        "proto/progress.proto",
        "proto/blockstore.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
