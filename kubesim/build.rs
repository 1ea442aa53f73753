//! Compiles the Kubernetes `.proto` files in `proto/` into one descriptor set
//! (`$OUT_DIR/kubernetes.fds`) that `src/protobuf.rs` embeds to decode protobuf request bodies.
//! A file that does not parse or an import that cannot be found fails the build with protox's
//! message naming the file and line.

use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(root, &mut files);
    files.sort();
    let descriptors = protox::compile(&files, [root]).unwrap_or_else(|e| panic!("{e:?}"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(
        out.join("kubernetes.fds"),
        prost::Message::encode_to_vec(&descriptors),
    )
    .expect("write the descriptor set");
}

/// Every `.proto` file under `dir`.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("read proto directory").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "proto") {
            files.push(path);
        }
    }
}
