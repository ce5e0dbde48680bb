//! The library's modules are layers that only look down (see the layer list in `src/lib.rs`),
//! grouped in folders of `src/` that only look down too:
//! - a module may refer to modules of lower layers only;
//! - each module lives in the folder [`FOLDERS`] gives it, each folder opens (`mod.rs`) with docs
//!   saying what it owns and must not touch, and a folder never refers to a folder above it;
//! - a file or folder missing from the tables (a new one must be given its place) fails.

use std::collections::BTreeMap;
use std::path::Path;

/// The folders of `src/`, bottom to top, and the modules each holds. `config.rs` (the builder,
/// the top layer) stays beside `lib.rs`.
const FOLDERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "invalid",
            "error",
            "metrics",
            "endpoint",
            "owner",
            "reply",
            "slots",
            "scripts",
            "sem_rw_scripts",
            "line",
        ],
    ),
    (
        "nodes",
        &[
            "busy",
            "caps",
            "connection",
            "node_status",
            "cluster",
            "topology",
            "native",
            "batch",
            "batcher",
            "confirm",
            "node",
            "node_confirm",
            "node_gate",
            "node_lock",
            "node_extend_many",
            "node_primitives",
            "node_ops",
            "subscriber",
        ],
    ),
    (
        "rounds",
        &[
            "quorum",
            "holds",
            "handover",
            "redlock",
            "held_rounds",
            "attempt",
            "handover_rounds",
            "background",
            "acquire_loop",
            "options",
            "lock",
        ],
    ),
    ("ops", &["inspect", "force"]),
    (
        "hold",
        &[
            "pacing",
            "status",
            "renewal",
            "keepalive",
            "with_lock",
            "shutdown",
        ],
    ),
    (
        "primitives",
        &[
            "leader",
            "campaign",
            "campaign_observers",
            "election",
            "observe",
            "semaphore_round",
            "semaphore",
            "rwlock_round",
            "rwlock",
            "lease",
        ],
    ),
];

/// Modules beside `lib.rs`, above every folder.
const TOP: &[&str] = &["config"];

/// Bottom to top; modules on one line share a layer and do not refer to each other.
const LAYERS: &[&[&str]] = &[
    &["invalid"],
    &["error"],
    &["metrics", "caps", "busy"],
    &["sem_rw_scripts"],
    &[
        "endpoint",
        "scripts",
        "connection",
        "reply",
        "slots",
        "line",
        "owner",
    ],
    &["topology", "node_status", "confirm"],
    &["cluster", "native"],
    &["batch"],
    &["batcher"],
    &["node", "quorum"],
    &["node_gate", "node_confirm"],
    &[
        "node_lock",
        "node_extend_many",
        "node_primitives",
        "node_ops",
    ],
    &["background", "pacing", "subscriber", "holds"],
    &["handover"],
    &["redlock"],
    &["held_rounds"],
    &["attempt"],
    &["handover_rounds"],
    &["acquire_loop"],
    &["options"],
    &["lock", "inspect", "leader"],
    &["status"],
    &["renewal", "force", "observe"],
    &["keepalive", "campaign_observers"],
    &["semaphore_round", "rwlock_round", "campaign"],
    &[
        "with_lock",
        "election",
        "semaphore",
        "lease",
        "rwlock",
        "shutdown",
    ],
    &["config"],
];

/// Where a module sits: its layer and its folder (`FOLDERS.len()` for the top).
struct Place {
    layer: usize,
    folder: usize,
}

fn places() -> BTreeMap<&'static str, Place> {
    let mut folder_of = BTreeMap::new();
    for (i, (_, modules)) in FOLDERS.iter().enumerate() {
        for m in *modules {
            folder_of.insert(*m, i);
        }
    }
    for m in TOP {
        folder_of.insert(*m, FOLDERS.len());
    }
    let mut map = BTreeMap::new();
    for (layer, row) in LAYERS.iter().enumerate() {
        for m in *row {
            let folder = *folder_of
                .get(m)
                .unwrap_or_else(|| panic!("module {m} is in LAYERS but in no folder"));
            map.insert(*m, Place { layer, folder });
        }
    }
    for m in folder_of.keys() {
        assert!(
            map.contains_key(m),
            "module {m} is in a folder but in no layer"
        );
    }
    map
}

fn is_folder(name: &str) -> bool {
    FOLDERS.iter().any(|(f, _)| *f == name)
}

/// `crate::x` and `crate::folder::x` references in code, as module names (comments, including
/// doc comments, are skipped).
fn references(source: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split(" //").next().unwrap_or(code);
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + 7..];
            let mut name = ident(rest);
            if is_folder(&name) && rest[name.len()..].starts_with("::") {
                name = ident(&rest[name.len() + 2..]);
            }
            if !name.is_empty() {
                out.push((n + 1, name));
            }
        }
    }
    out
}

/// Every `.rs` file under `src/` but `lib.rs` and the folders' `mod.rs`: (folder, module, path).
fn module_files(src: &Path) -> Vec<(Option<String>, String, std::path::PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(src).expect("src/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).expect("folder") {
                let p = inner.expect("entry").path();
                let stem = p
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("")
                    .to_string();
                if stem != "mod" && p.extension().and_then(|e| e.to_str()) == Some("rs") {
                    out.push((Some(name.clone()), stem, p));
                }
            }
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" {
                out.push((None, stem.to_string(), path));
            }
        }
    }
    out
}

/// Each folder of `FOLDERS` exists and opens with its docs; no other folder exists.
fn folder_problems(src: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (folder, _) in FOLDERS {
        let doc = std::fs::read_to_string(src.join(folder).join("mod.rs")).unwrap_or_default();
        if !doc.trim_start().starts_with("//!") {
            problems.push(format!(
                "src/{folder}/mod.rs is missing or does not open with //! docs saying what the \
                 folder owns and must not touch"
            ));
        }
    }
    for entry in std::fs::read_dir(src).expect("src/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|s| s.to_str()).unwrap_or("");
        if path.is_dir() && !is_folder(name) {
            problems.push(format!("src/{name}/ is in no FOLDERS entry"));
        }
    }
    problems
}

#[test]
fn modules_and_folders_only_look_down() {
    let places = places();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = folder_problems(&src);
    let files = module_files(&src);
    for (folder, module, path) in &files {
        let Some(own) = places.get(module.as_str()) else {
            problems.push(format!(
                "{} is in no layer: add it to LAYERS, FOLDERS and its folder's mod.rs",
                path.display()
            ));
            continue;
        };
        let expected = FOLDERS.get(own.folder).map(|(f, _)| *f);
        if folder.as_deref() != expected {
            problems.push(format!(
                "{} belongs in src/{}",
                path.display(),
                expected.map(|f| format!("{f}/")).unwrap_or_default()
            ));
        }
        let source = std::fs::read_to_string(path).expect("read");
        for (line, target) in references(&source) {
            let Some(t) = places.get(target.as_str()) else {
                continue; // crate-root re-exports are not library layers
            };
            if target != *module && t.layer >= own.layer {
                problems.push(format!(
                    "{}:{line} (layer {}) refers to crate::{target} (layer {})",
                    path.display(),
                    own.layer,
                    t.layer
                ));
            }
            if t.folder > own.folder {
                problems.push(format!(
                    "{}:{line} refers to crate::{target}, in a folder above its own",
                    path.display()
                ));
            }
        }
    }
    assert!(
        files.len() >= 20,
        "only {} modules found under {}",
        files.len(),
        src.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself: it must see an upward reference in code through a folder, and ignore
/// comments.
#[test]
fn the_check_can_fail() {
    let refs = references(
        "use crate::hold::keepalive::X;\n/// [`crate::config`]\nlet a = crate::nodes::node::f(); // crate::election\nuse crate::Error;\n",
    );
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["keepalive", "node"]);
    let places = places();
    assert!(places["keepalive"].layer > places["node"].layer);
    assert!(places["keepalive"].folder > places["node"].folder);
}
