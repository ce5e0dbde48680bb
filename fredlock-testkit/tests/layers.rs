//! No import circle among the modules of the testkit, nor among those of the `fredlock` command:
//! imports only look one way, so each module can be read (and changed) knowing only the modules
//! below it. What two modules share goes down into a module of its own that both import.
//!
//! The check reads the source files as text. A module is a file (`mod x;`); module `a` imports
//! module `b` when code of `a` names a path that leads into `b` (`use crate::b::X`,
//! `super::b::f()`, `b::X` for a child `b`), following `use` re-exports to the module that
//! defines the item, so `crate::LocalNodes` leads to `server`, not to `lib.rs`. A child naming an
//! item its parent DEFINES imports the parent. Test-only inline modules (`#[cfg(test)] mod x {`)
//! and comments do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One token of Rust source: an identifier or keyword, `::`, or one other character.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Sep,
    Punct(char),
}

/// The source with comments, string and char literals blanked (newlines kept, so line numbers
/// hold).
fn blank_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let end = literal_or_comment_end(&chars, i);
        if end == i {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        for &c in &chars[i..end] {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
        i = end;
    }
    out
}

/// Where the comment or literal starting at `i` ends (`i` itself when none starts there).
fn literal_or_comment_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    match (at(i), at(i + 1)) {
        ('/', '/') => (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len()),
        ('/', '*') => block_comment_end(c, i),
        ('"', _) => quoted_end(c, i + 1, '"'),
        ('r', '"') | ('r', '#') if i == 0 || !is_ident(at(i - 1)) => raw_string_end(c, i),
        ('\'', '\\') => quoted_end(c, i + 1, '\''),
        ('\'', _) if at(i + 2) == '\'' => i + 3,
        _ => i,
    }
}

fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i + 1 < c.len() {
        if c[i] == '/' && c[i + 1] == '*' {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c[i + 1] == '/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    c.len()
}

fn quoted_end(c: &[char], mut i: usize, quote: char) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            q if q == quote => return i + 1,
            _ => i += 1,
        }
    }
    c.len()
}

fn raw_string_end(c: &[char], i: usize) -> usize {
    let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
    if c.get(i + 1 + hashes) != Some(&'"') {
        return i; // `r#ident` or an identifier starting with r
    }
    let mut k = i + 2 + hashes;
    while k < c.len() {
        if c[k] == '"'
            && c[k + 1..]
                .iter()
                .take(hashes)
                .filter(|&&h| h == '#')
                .count()
                == hashes
        {
            return k + 1 + hashes;
        }
        k += 1;
    }
    c.len()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens of blanked source, each with its line number (from 1).
fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if is_ident(c) {
                let len = chars[i..].iter().take_while(|&&c| is_ident(c)).count();
                out.push((n + 1, Tok::Ident(chars[i..i + len].iter().collect())));
                i += len;
            } else if c == ':' && chars.get(i + 1) == Some(&':') {
                out.push((n + 1, Tok::Sep));
                i += 2;
            } else {
                out.push((n + 1, Tok::Punct(c)));
                i += 1;
            }
        }
    }
    out
}

/// The tokens without test-only inline modules (`#[cfg(test)] mod name { ... }`).
fn without_test_modules(toks: Vec<(usize, Tok)>) -> Vec<(usize, Tok)> {
    let cfg_test: Vec<Tok> = "# [ cfg ( test ) ] mod"
        .split(' ')
        .map(|t| match t {
            "cfg" | "test" | "mod" => Tok::Ident(t.to_owned()),
            p => Tok::Punct(p.chars().next().unwrap_or(' ')),
        })
        .collect();
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let starts = toks[i..].iter().map(|(_, t)| t).take(cfg_test.len());
        let inline = toks.get(i + cfg_test.len() + 1).map(|(_, t)| t) == Some(&Tok::Punct('{'));
        if inline && starts.eq(cfg_test.iter()) {
            i = matching_brace(&toks, i + cfg_test.len() + 1) + 1;
            continue;
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

fn matching_brace(toks: &[(usize, Tok)], open: usize) -> usize {
    let mut depth = 0;
    for (k, (_, t)) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') if depth == 1 => return k,
            Tok::Punct('}') => depth -= 1,
            _ => {}
        }
    }
    toks.len()
}

/// A `use` tree expanded into bindings (a glob binds `*`), from the token after `use` on.
fn use_tree(toks: &[(usize, Tok)], i: &mut usize, prefix: &[String], out: &mut Vec<Binding>) {
    let mut path = prefix.to_vec();
    let mut bound = false; // this item already bound (an alias, a glob, a group)
    while let Some((line, t)) = toks.get(*i) {
        *i += 1;
        match t {
            Tok::Ident(s) if s == "as" => {
                if let Some((_, Tok::Ident(alias))) = toks.get(*i) {
                    *i += 1;
                    out.push(Binding::new(alias, &path, *line));
                    bound = true;
                }
            }
            // `self` in a group stands for the group's prefix.
            Tok::Ident(s) if s == "self" && path.len() == prefix.len() => {}
            Tok::Ident(s) => path.push(s.clone()),
            Tok::Punct('*') => {
                out.push(Binding::new("*", &path, *line));
                bound = true;
            }
            Tok::Punct('{') => {
                use_tree(toks, i, &path, out);
                bound = true;
            }
            Tok::Punct(c @ (',' | '}' | ';')) => {
                match path.last() {
                    Some(name) if !bound => out.push(Binding::new(name, &path, *line)),
                    _ => {}
                }
                if *c != ',' {
                    return;
                }
                path = prefix.to_vec();
                bound = false;
            }
            _ => {}
        }
    }
}

/// A name a `use` brings into a module, and the path it stands for.
#[derive(Debug, Clone)]
struct Binding {
    name: String,
    path: Vec<String>,
    line: usize,
    /// `pub use`: a name the module passes on (its table of contents), not one its code uses.
    reexport: bool,
}

impl Binding {
    fn new(name: &str, path: &[String], line: usize) -> Binding {
        Binding {
            name: name.to_owned(),
            path: path.to_vec(),
            line,
            reexport: false,
        }
    }
}

/// One module (one file) of a crate.
#[derive(Debug, Default)]
struct Module {
    /// `crate`, `crate::torture`, `crate::torture::env`, ...
    name: String,
    file: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    uses: Vec<Binding>,
    /// Paths named in code outside `use` (`crate::x::f()`, `super::X`, `child::f()`).
    paths: Vec<(usize, Vec<String>)>,
}

/// What one file says: its `mod x;` declarations, its `use` bindings, the paths in its code.
#[derive(Debug, Default)]
struct Parsed {
    mods: Vec<String>,
    uses: Vec<Binding>,
    paths: Vec<(usize, Vec<String>)>,
}

fn read_module(source: &str) -> Parsed {
    let toks = without_test_modules(tokens(&blank_comments_and_literals(source)));
    let Parsed {
        mut mods,
        mut uses,
        mut paths,
    } = Parsed::default();
    let ident = |k: usize| match toks.get(k) {
        Some((_, Tok::Ident(s))) => Some(s.as_str()),
        _ => None,
    };
    let mut i = 0;
    while i < toks.len() {
        let after_sep = i > 0 && toks[i - 1].1 == Tok::Sep;
        // `pub(in super::super)` names who may see an item, not an import.
        let visibility = i > 1 && toks[i - 2].1 == Tok::Punct('(') && ident(i - 1) == Some("in");
        match ident(i) {
            Some("mod") if toks.get(i + 2).map(|t| &t.1) == Some(&Tok::Punct(';')) => {
                mods.extend(ident(i + 1).map(str::to_owned));
                i += 3;
            }
            Some("use") => {
                let first = uses.len();
                let public = is_public(&toks[..i]);
                i += 1;
                use_tree(&toks, &mut i, &[], &mut uses);
                uses[first..].iter_mut().for_each(|b| b.reexport = public);
            }
            Some(_) if visibility => i += 1,
            Some(first) if !after_sep && toks.get(i + 1).map(|t| &t.1) == Some(&Tok::Sep) => {
                let line = toks[i].0;
                let mut path = vec![first.to_owned()];
                i += 1;
                while toks.get(i).map(|t| &t.1) == Some(&Tok::Sep) {
                    let Some(next) = ident(i + 1) else { break };
                    path.push(next.to_owned());
                    i += 2;
                }
                paths.push((line, path));
            }
            _ => i += 1,
        }
    }
    Parsed { mods, uses, paths }
}

/// Whether the item whose tokens follow `before` is `pub` or `pub(...)`.
fn is_public(before: &[(usize, Tok)]) -> bool {
    let ident = |k: usize| matches!(before.get(k), Some((_, Tok::Ident(s))) if s == "pub");
    match before.last() {
        Some((_, Tok::Punct(')'))) => before
            .iter()
            .rposition(|(_, t)| *t == Tok::Punct('('))
            .is_some_and(|open| open > 0 && ident(open - 1)),
        Some(_) => ident(before.len() - 1),
        None => false,
    }
}

/// A crate's modules, read from its root file through its `mod x;` declarations.
struct Crate {
    modules: Vec<Module>,
}

impl Crate {
    /// `read` gives a file's text by its path (relative to the crate's `src/`), or `None`.
    fn load(root: &str, read: &dyn Fn(&str) -> Option<String>) -> Crate {
        let mut krate = Crate {
            modules: Vec::new(),
        };
        krate.add("crate".to_owned(), root.to_owned(), None, read);
        krate
    }

    fn add(
        &mut self,
        name: String,
        file: String,
        parent: Option<usize>,
        read: &dyn Fn(&str) -> Option<String>,
    ) -> Option<usize> {
        let source = read(&file)?;
        let Parsed { mods, uses, paths } = read_module(&source);
        let id = self.modules.len();
        // A file's child modules live in the folder of its name (`a.rs`: `a/`), except for
        // `lib.rs`, `main.rs` and `mod.rs`, whose children live beside them.
        let owns_folder = ["lib.rs", "main.rs", "mod.rs"]
            .iter()
            .any(|f| file == *f || file.ends_with(&format!("/{f}")));
        let dir = match file.rsplit_once('/') {
            Some((d, _)) if owns_folder => format!("{d}/"),
            None if owns_folder => String::new(),
            _ => format!("{}/", file.trim_end_matches(".rs")),
        };
        self.modules.push(Module {
            name: name.clone(),
            file,
            parent,
            uses,
            paths,
            ..Module::default()
        });
        for m in mods {
            let child = [format!("{dir}{m}.rs"), format!("{dir}{m}/mod.rs")]
                .into_iter()
                .find_map(|f| self.add(format!("{name}::{m}"), f, Some(id), read));
            if let Some(child) = child {
                self.modules[id].children.insert(m, child);
            }
        }
        Some(id)
    }

    /// The module a path named in module `from` leads into, following `use` bindings; `None`
    /// for paths outside the crate (`std::`, `fredlock::`, local names).
    fn resolve(&self, from: usize, path: &[String], depth: usize) -> Option<usize> {
        let (first, rest) = path.split_first()?;
        if depth > 16 {
            return None;
        }
        let start = match first.as_str() {
            "crate" => 0,
            "self" => from,
            "super" => self.modules[from].parent?,
            name if self.modules[from].children.contains_key(name) => {
                return self.walk(from, path, depth)
            }
            name => {
                let b = self.modules[from].uses.iter().find(|b| b.name == name)?;
                let full: Vec<String> = b.path.iter().chain(rest).cloned().collect();
                return self.resolve(from, &full, depth + 1);
            }
        };
        if rest.first().map(String::as_str) == Some("super") {
            return self.resolve(start, rest, depth + 1);
        }
        self.walk(start, rest, depth)
    }

    /// Down from module `at` along `path`: into child modules, then through a `use` binding of
    /// the module the path stops in, or to that module when it defines the item itself.
    fn walk(&self, mut at: usize, path: &[String], depth: usize) -> Option<usize> {
        for (k, seg) in path.iter().enumerate() {
            if let Some(&child) = self.modules[at].children.get(seg) {
                at = child;
                continue;
            }
            let bound = self.modules[at].uses.iter().find(|b| &b.name == seg);
            return match bound {
                Some(b) => {
                    let full: Vec<String> = b.path.iter().chain(&path[k + 1..]).cloned().collect();
                    self.resolve(at, &full, depth + 1)
                }
                None => Some(at),
            };
        }
        Some(at)
    }

    /// Every import between two different modules: (from, to) -> the first line that makes it.
    fn edges(&self) -> BTreeMap<(usize, usize), usize> {
        let mut edges = BTreeMap::new();
        for (id, m) in self.modules.iter().enumerate() {
            let used = m.uses.iter().filter(|b| !b.reexport);
            let named = used.map(|b| (b.line, &b.path));
            for (line, path) in named.chain(m.paths.iter().map(|(l, p)| (*l, p))) {
                if let Some(to) = self.resolve(id, path, 0).filter(|&to| to != id) {
                    edges.entry((id, to)).or_insert(line);
                }
            }
        }
        edges
    }

    /// Each import circle: the modules that import each other (directly or not), and the
    /// shortest circle through the first of them with the line that makes each import.
    fn circles(&self) -> Vec<String> {
        let edges = self.edges();
        let reach: Vec<BTreeSet<usize>> = (0..self.modules.len())
            .map(|m| reachable(m, &edges))
            .collect();
        let mut reported: BTreeSet<usize> = BTreeSet::new();
        let mut out = Vec::new();
        for start in 0..self.modules.len() {
            if reported.contains(&start) || !reach[start].contains(&start) {
                continue;
            }
            let together: Vec<usize> = reach[start]
                .iter()
                .copied()
                .filter(|&m| reach[m].contains(&start))
                .collect();
            reported.extend(&together);
            let names: Vec<&str> = together
                .iter()
                .map(|&m| self.modules[m].file.as_str())
                .collect();
            let circle = shortest_circle(start, &edges).unwrap_or_default();
            out.push(format!(
                "{} files import each other: {}\n  e.g. {}",
                together.len(),
                names.join(", "),
                self.describe(&circle, &edges)
            ));
        }
        out
    }

    fn describe(&self, circle: &[usize], edges: &BTreeMap<(usize, usize), usize>) -> String {
        let steps: Vec<String> = circle
            .iter()
            .zip(circle.iter().cycle().skip(1))
            .map(|(&a, &b)| {
                let m = &self.modules[a];
                format!("{} ({}:{})", m.name, m.file, edges[&(a, b)])
            })
            .collect();
        format!("{} -> back", steps.join(" -> "))
    }
}

/// The modules `start` imports, directly or not (itself only if it is on a circle).
fn reachable(start: usize, edges: &BTreeMap<(usize, usize), usize>) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(a) = todo.pop() {
        for &(_, b) in edges.range((a, 0)..=(a, usize::MAX)).map(|(k, _)| k) {
            if seen.insert(b) {
                todo.push(b);
            }
        }
    }
    seen
}

/// The shortest path of imports from `start` back to itself (breadth first), if any.
fn shortest_circle(start: usize, edges: &BTreeMap<(usize, usize), usize>) -> Option<Vec<usize>> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut frontier = vec![start];
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for &a in &frontier {
            for &(_, b) in edges.range((a, 0)..=(a, usize::MAX)).map(|(k, _)| k) {
                if b == start {
                    let mut circle = vec![a];
                    while let Some(&p) = came_from.get(circle.last()?) {
                        circle.push(p);
                    }
                    circle.reverse();
                    return Some(circle);
                }
                if b != start && !came_from.contains_key(&b) {
                    came_from.insert(b, a);
                    next.push(b);
                }
            }
        }
        frontier = next;
    }
    None
}

fn on_disk(src: &Path) -> impl Fn(&str) -> Option<String> + '_ {
    move |file| std::fs::read_to_string(src.join(file)).ok()
}

fn assert_no_circle(src: &Path, root: &str, at_least: usize) {
    let krate = Crate::load(root, &on_disk(src));
    assert!(
        krate.modules.len() >= at_least,
        "only {} modules found from {}",
        krate.modules.len(),
        src.join(root).display()
    );
    let circles = krate.circles();
    assert!(
        circles.is_empty(),
        "import circles in {} (move what the modules share into a module of its own that both \
         import):\n{}",
        src.display(),
        circles.join("\n")
    );
}

#[test]
fn the_testkit_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_no_circle(&src, "lib.rs", 30);
}

#[test]
fn the_cli_has_no_import_circle() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fredlock-cli");
    if !cli.join("Cargo.toml").exists() {
        eprintln!("no fredlock-cli beside this crate (not in the workspace): nothing to check");
        return;
    }
    assert_no_circle(&cli.join("src"), "main.rs", 8);
}

/// A crate made of the given files, for the checker's own tests.
fn fake(files: &[(&str, &str)]) -> Crate {
    let files: BTreeMap<String, String> = files
        .iter()
        .map(|(f, s)| (f.to_string(), s.to_string()))
        .collect();
    Crate::load("lib.rs", &|f| files.get(f).cloned())
}

#[test]
fn the_check_sees_a_circle_through_re_exports_and_parents() {
    let siblings = fake(&[
        ("lib.rs", "mod a; mod b; pub use b::Thing;"),
        ("a.rs", "use crate::Thing; pub fn f() {}"),
        ("b.rs", "pub struct Thing; fn g() { crate::a::f() }"),
    ]);
    assert_eq!(
        siblings.circles().len(),
        1,
        "a -> b (via lib's re-export) -> a"
    );
    let parent = fake(&[
        ("lib.rs", "mod t;"),
        (
            "t/mod.rs",
            "mod env; pub struct Config; fn run() { env::go() }",
        ),
        ("t/env.rs", "use super::{Config, self as t}; pub fn go() {}"),
    ]);
    assert_eq!(parent.circles().len(), 1, "t -> t::env -> t (Config)");
    let grouped = fake(&[
        ("lib.rs", "mod t;"),
        ("t.rs", "mod x; mod y;"),
        ("t/x.rs", "use super::{y::{self, Y}};\npub struct X;"),
        (
            "t/y.rs",
            "pub struct Y; impl Y { fn x() -> super::x::X { todo!() } }",
        ),
    ]);
    let circles = grouped.circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(circles[0].contains("t/x.rs:1") && circles[0].contains("t/y.rs:1"));
}

#[test]
fn the_check_ignores_comments_strings_tests_and_one_way_imports() {
    let krate = fake(&[
        ("lib.rs", "mod a; mod b; pub use a::A;"),
        ("a.rs", "// crate::b::B\n/// [`crate::b`]\npub struct A(&'static str);\nconst S: &str = \"crate::b::x\";\nconst R: &str = r#\"super::b\"#;\n#[cfg(test)]\nmod tests { use crate::b::B; }"),
        ("b.rs", "use crate::A; pub struct B; fn c() -> char { '{' }"),
    ]);
    assert_eq!(krate.modules.len(), 3);
    assert_eq!(krate.edges().len(), 1, "only b -> a: {:?}", krate.edges());
    assert!(krate.circles().is_empty());
}
