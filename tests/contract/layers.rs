//! `actors/` stays in layers: `decide` (pure decisions) → `state` (what the controllers know) →
//! `effects` (writes, cloud calls, events, metrics) → the actors, each module importing only from
//! its own layer or those below, no two modules reaching each other through any chain of imports,
//! and nothing in `decide` touching actix, the Kubernetes client or the cloud. The module graph is
//! read from the sources with `syn`: every `use` and every path in code (not in comments, and not in
//! `#[cfg(test)]` modules) that starts at `crate`, `super` or `self`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::visit::Visit;

/// A module path inside the crate, `[]` for the crate root.
type Module = Vec<String>;

/// The layers, bottom first; a module's layer is named by its first segment, anything else is an
/// actor (the top layer).
const LAYERS: [&str; 3] = ["decide", "state", "effects"];
const ACTORS: usize = LAYERS.len();

fn layer(module: &[String]) -> usize {
    module
        .first()
        .and_then(|top| LAYERS.iter().position(|layer| layer == top))
        .unwrap_or(ACTORS)
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// Every `.rs` file under `root` with the module it defines.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.map(|e| e.unwrap_or_else(|e| panic!("{e}")).path()) {
            if entry.is_dir() {
                dirs.push(entry);
                continue;
            }
            if entry.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = entry.strip_prefix(root).unwrap_or_else(|e| panic!("{e}"));
            let mut module: Module = relative
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod" || last == "lib") {
                module.pop();
            }
            found.insert(module, entry);
        }
    }
    found
}

/// The paths a file's code names, as written (`crate::a::b`, `super::c`), and the crates it names
/// first (`actix`, `kube::Api`).
#[derive(Default)]
struct Paths {
    local: Vec<Vec<String>>,
    external: Vec<Vec<String>>,
}

impl Paths {
    fn add(&mut self, segments: Vec<String>) {
        match segments.first().map(String::as_str) {
            Some("crate" | "super" | "self") => self.local.push(segments),
            Some(_) => self.external.push(segments),
            None => {}
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => self.add(with(prefix, &name.ident)),
            syn::UseTree::Rename(rename) => self.add(with(prefix, &rename.ident)),
            syn::UseTree::Glob(_) => self.add(prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

fn with(prefix: &[String], ident: &syn::Ident) -> Vec<String> {
    prefix.iter().cloned().chain([ident.to_string()]).collect()
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !is_test_only(&module.attrs) {
            syn::visit::visit_item_mod(self, module);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.add(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The module a path written in `from` lands in: the longest prefix that is a module.
fn resolve(path: &[String], from: &[String], known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut absolute: Module = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") => {
            absolute = from.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            absolute = from.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                absolute.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    absolute.extend(rest.iter().cloned());
    (0..=absolute.len())
        .rev()
        .map(|end| absolute[..end].to_vec())
        .find(|candidate| known.contains_key(candidate))
}

/// Each module's imports of other modules, and what each `decide` module names outside the
/// crate that it must not.
fn graph(root: &Path) -> (BTreeMap<Module, BTreeSet<Module>>, Vec<String>) {
    let known = modules(root);
    let mut edges = BTreeMap::new();
    let mut impure = Vec::new();
    for (module, file) in &known {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut paths = Paths::default();
        paths.visit_file(&parsed);
        let targets: BTreeSet<Module> = paths
            .local
            .iter()
            .filter_map(|path| resolve(path, module, &known))
            .filter(|target| target != module && !target.is_empty())
            .collect();
        edges.insert(module.clone(), targets);
        if layer(module) == 0 {
            impure.extend(
                paths
                    .external
                    .iter()
                    .filter(|path| forbidden_in_decisions(path))
                    .map(|path| format!("{} names {}", name(module), path.join("::"))),
            );
        }
    }
    (edges, impure)
}

/// Whether a decision names the actor runtime, the Kubernetes client or the cloud.
fn forbidden_in_decisions(path: &[String]) -> bool {
    let segments: Vec<&str> = path.iter().map(String::as_str).collect();
    matches!(
        segments.as_slice(),
        ["actix", ..]
            | ["kube", "Api" | "Client" | "api" | "runtime", ..]
            | ["tokio", "spawn" | "task" | "net", ..]
            | ["joist_provider", "CloudProvider", ..]
    )
}

/// The imports that point up a layer, and the groups of modules that reach each other.
fn violations(edges: &BTreeMap<Module, BTreeSet<Module>>) -> (Vec<String>, Vec<Vec<String>>) {
    let upward = edges
        .iter()
        .flat_map(|(from, targets)| targets.iter().map(move |to| (from, to)))
        .filter(|(from, to)| layer(to) > layer(from))
        .map(|(from, to)| format!("{} imports {} from a higher layer", name(from), name(to)))
        .collect();
    (upward, circles(edges))
}

/// Strongly connected groups of more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, module: &'a Module) {
            let next = self.index.len();
            self.index.insert(module, next);
            self.low.insert(module, next);
            self.stack.push(module);
            self.on_stack.insert(module);
            for target in self.edges.get(module).into_iter().flatten() {
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[module].min(self.low[target]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[module].min(self.index[target]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut group = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    group.push(name(member));
                    if member == module {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in edges.keys() {
        if !walk.index.contains_key(module) {
            walk.visit(module);
        }
    }
    walk.found
}

#[test]
fn actors_are_in_layers_without_a_circle_and_decisions_do_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("actors/src");
    let (edges, impure) = graph(&root);
    assert!(
        edges.len() > 40,
        "read only {} modules of {}",
        edges.len(),
        root.display()
    );
    let (upward, circles) = violations(&edges);
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
    assert!(circles.is_empty(), "modules that import each other: {circles:?}");
    assert!(impure.is_empty(), "decisions doing I/O:\n{}", impure.join("\n"));
}

#[test]
fn the_check_finds_an_upward_import_and_a_circle() {
    let module = |path: &str| -> Module { path.split("::").map(str::to_owned).collect() };
    let edges: BTreeMap<Module, BTreeSet<Module>> = [
        ("decide::a", vec!["effects::b"]),
        ("effects::b", vec!["node_pool"]),
        ("node_pool", vec!["effects::b"]),
    ]
    .into_iter()
    .map(|(from, to)| (module(from), to.into_iter().map(module).collect()))
    .collect();
    let (upward, circles) = violations(&edges);
    assert_eq!(
        upward,
        [
            "decide::a imports effects::b from a higher layer",
            "effects::b imports node_pool from a higher layer"
        ]
    );
    assert_eq!(circles, [vec!["effects::b".to_owned(), "node_pool".to_owned()]]);
    assert!(forbidden_in_decisions(&module("kube::Api")));
    assert!(!forbidden_in_decisions(&module("kube::ResourceExt")));
}
