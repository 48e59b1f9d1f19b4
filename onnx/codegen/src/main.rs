//! Compiles `onnx/proto/onnx.proto` with protox (a protobuf compiler in Rust) and writes the
//! prost structs to `onnx/src/proto.rs`, which is checked in: building Kiln needs no protoc.
//! Run by `scripts/gen_onnx_proto.sh`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let descriptors = protox::compile(["onnx.proto"], [root.join("proto")])?;
    let out = tempdir()?;
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(descriptors)?;
    let generated = std::fs::read_to_string(out.join("onnx.rs"))?;
    let header = "//! ONNX's protobuf messages, generated from `onnx/proto/onnx.proto` (onnx 1.23.2) by\n\
                  //! `scripts/gen_onnx_proto.sh`. Do not edit.\n\n";
    std::fs::write(root.join("src/proto.rs"), format!("{header}{generated}"))?;
    Ok(())
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("kiln-onnx-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
