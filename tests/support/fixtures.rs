//! The project's corpora of Karpenter manifests (`tests/fixtures/valid`, `invalid`, `legacy`), read
//! as the contract tests and the real-control-plane tests both judge them, and the fuzzers' bases.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use proptest::sample::Index;
use serde_json::Value;

use super::mutants::Mutant;

/// The `*.yaml` files of `tests/fixtures/<dir>`, sorted by name.
pub fn fixtures(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.map(|e| e.path()).unwrap_or_default())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", root.display());
    files
}

/// The text of a fixture.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of the kinds Karpenter serves in `text` (its own groups' and CapacityBuffers),
/// read from `path`.
pub fn documents(path: &Path, text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .filter(|d| {
            d["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("karpenter") || v.starts_with("autoscaling.x-k8s.io/"))
        })
        .collect()
}

/// The valid fixtures' Karpenter objects, by kind: the documents the fuzzers start from.
pub fn valid_by_kind() -> HashMap<String, Vec<Value>> {
    let mut bases: HashMap<String, Vec<Value>> = HashMap::new();
    for file in fixtures("valid") {
        for document in documents(&file, &read(&file)) {
            let kind = document["kind"].as_str().unwrap_or_default().to_owned();
            bases.entry(kind).or_default().push(document);
        }
    }
    bases
}

/// One of `bases` (documents by kind) of the mutant's kind, chosen by `pick`, with the mutant
/// applied.
pub fn applied(bases: &HashMap<String, Vec<Value>>, mutant: &Mutant, pick: &Index) -> Value {
    let candidates = &bases[&mutant.field.kind];
    let mut document = candidates[pick.index(candidates.len())].clone();
    mutant.field.set(&mut document, mutant.value.clone());
    document
}
