//! The library's modules are layers that only look down (see the layer list in `src/lib.rs`):
//! a module may refer to modules of lower layers only. A reference to a higher layer, or to a
//! module missing from the list (a new file must be given its layer), fails this test.

use std::collections::BTreeMap;

/// Bottom to top; modules on one line share a layer and do not refer to each other.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["metrics", "caps"],
    &[
        "endpoint",
        "scripts",
        "connection",
        "reply",
        "slots",
        "line",
        "owner",
    ],
    &["cluster", "native"],
    &["batch"],
    &["node", "quorum"],
    &["background", "pacing", "subscriber"],
    &["redlock"],
    &["acquire_loop"],
    &["lock", "inspect", "leader"],
    &["status"],
    &["renewal", "force", "observe"],
    &["keepalive"],
    &["semaphore_round", "rwlock_round", "campaign"],
    &["with_lock", "election", "semaphore", "lease", "rwlock"],
    &["config"],
];

fn layer_of() -> BTreeMap<&'static str, usize> {
    let mut map = BTreeMap::new();
    for (i, layer) in LAYERS.iter().enumerate() {
        for m in *layer {
            map.insert(*m, i);
        }
    }
    map
}

/// `crate::x` references in code (comments, including doc comments, are skipped).
fn references(source: &str) -> Vec<(usize, String)> {
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
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
        }
    }
    out
}

#[test]
fn modules_only_look_down() {
    let layers = layer_of();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("entry").path();
        let Some(module) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().and_then(|e| e.to_str()) != Some("rs") || module == "lib" {
            continue;
        }
        let Some(&own) = layers.get(module) else {
            problems.push(format!(
                "src/{module}.rs is in no layer: add it to LAYERS and lib.rs"
            ));
            continue;
        };
        seen += 1;
        let source = std::fs::read_to_string(&path).expect("read");
        for (line, target) in references(&source) {
            match layers.get(target.as_str()) {
                Some(&t) if t < own || target == module => {}
                Some(&t) => problems.push(format!(
                    "src/{module}.rs:{line} (layer {own}) refers to crate::{target} (layer {t})"
                )),
                // `crate::testkit` and crate-root re-exports are not library layers.
                None => {}
            }
        }
    }
    assert!(
        seen >= 10,
        "only {seen} modules found under {}",
        src.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself: it must see an upward reference in code, and ignore comments.
#[test]
fn the_check_can_fail() {
    let refs = references("use crate::keepalive::X;\n/// [`crate::config`]\nlet a = crate::node::f(); // crate::election\n");
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["keepalive", "node"]);
}
