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
    // Block payloads as `Bytes`: a decoded block is a slice of the call's receive buffer rather
    // than a copy into a fresh 4 MiB vector, and a block goes out in pieces that are slices of
    // one buffer.
    tonic_prost_build::configure()
        .bytes(".ferry.blockstore.v1.PutRequest.data")
        .bytes(".ferry.blockstore.v1.TakenBlock.data")
        .compile_fds(descriptors)?;
    Ok(())
}
