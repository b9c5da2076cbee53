//! No import circles anywhere in the workspace: within every crate (each
//! library, binary and multi-file test target of every workspace member),
//! the graph "module A uses something of module B" has no cycle.
//!
//! The graph is read from the source text: every file is a module (inline
//! `mod x { … }` blocks count as their file); an edge A → B is a path that
//! names B from A: `crate::b::…` (also inside `use crate::{…}` groups),
//! `self::b::…`, `super::…`, or a child module's bare name (`b::…` after
//! `mod b;`). A path naming an item of the crate root (`crate::App`) is
//! followed to the module the root re-exports it from. `mod` declarations
//! are not edges; comments and string literals are ignored. A test module
//! in its own file (`group/tests.rs`) is a module like any other; an inline
//! `#[cfg(test)] mod tests { … }` counts as its file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[test]
fn no_import_circles_in_the_workspace() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failures = Vec::new();
    let mut crates_seen = 0;
    for member in workspace_members(&root) {
        let dir = root.join(&member);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("member manifest");
        let package = package_name(&manifest);
        for crate_root in crate_roots(&dir, &manifest) {
            crates_seen += 1;
            let graph = Graph::of_crate(&crate_root);
            for cycle in graph.cycles() {
                failures.push(format!(
                    "{} ({}): {}",
                    package,
                    crate_root
                        .strip_prefix(&root)
                        .unwrap_or(&crate_root)
                        .display(),
                    cycle
                ));
            }
        }
    }
    assert!(
        crates_seen > 5,
        "found only {crates_seen} crates: is the workspace walked?"
    );
    assert!(
        failures.is_empty(),
        "import circles:\n{}",
        failures.join("\n")
    );
}

/// The checker sees through `use` groups, `super::`, child names and the
/// root's re-exports, ignores comments and strings, and names a circle.
#[test]
fn the_checker_finds_a_planted_circle() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod c;\npub use c::Thing;\n"),
        (
            "a.rs",
            "mod inner;\nuse crate::{b::{f, g}};\n// crate::c::x in a comment\nconst S: &str = \"crate::c::y\";\nfn m() { inner::n(); }\n",
        ),
        ("a/inner.rs", "use super::m;\npub fn n() {}\n"),
        ("b.rs", "fn f() { crate::Thing::new(); }\n"),
        (
            "c.rs",
            "pub struct Thing;\nfn x() { crate::a::inner::k(); }\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let graph = Graph::of_crate(&dir.join("lib.rs"));
    std::fs::remove_dir_all(&dir).unwrap();
    let edge = |a: &str, b: &str| {
        graph
            .edges
            .get(&(a.to_owned(), b.to_owned()))
            .map(|names| names.iter().cloned().collect::<Vec<_>>().join(", "))
    };
    assert_eq!(edge("a", "b").as_deref(), Some("f, g"));
    assert_eq!(
        edge("b", "c").as_deref(),
        Some("Thing"),
        "followed through the root's re-export"
    );
    assert_eq!(edge("c", "a::inner").as_deref(), Some("k"));
    assert_eq!(edge("a::inner", "a").as_deref(), Some("m"));
    assert_eq!(edge("a", "a::inner").as_deref(), Some("n"));
    assert_eq!(edge("a", "c"), None, "comments and strings are not code");
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].starts_with("circle of {"), "{}", cycles[0]);
    let members = &cycles[0]["circle of {".len()..cycles[0].find('}').unwrap()];
    let members: BTreeSet<&str> = members.split(", ").collect();
    assert_eq!(members, BTreeSet::from(["a", "b", "c", "a::inner"]));
}

/// `members = [...]` of the workspace manifest.
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace manifest");
    let start = manifest.find("members").expect("a members list");
    let list = &manifest[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

fn package_name(manifest: &str) -> String {
    manifest
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("name").map(|rest| {
                rest.trim_start_matches([' ', '='])
                    .trim()
                    .trim_matches('"')
                    .to_owned()
            })
        })
        .expect("a package name")
}

/// Each target's root file: `src/lib.rs`, `src/main.rs`, `src/bin/*.rs`, and
/// every `path = "…"` of a `[lib]`, `[[bin]]` or `[[test]]` section.
fn crate_roots(dir: &Path, manifest: &str) -> Vec<PathBuf> {
    let mut roots = BTreeSet::new();
    for default in ["src/lib.rs", "src/main.rs"] {
        if dir.join(default).is_file() {
            roots.insert(dir.join(default));
        }
    }
    if let Ok(bins) = std::fs::read_dir(dir.join("src/bin")) {
        for e in bins.flatten() {
            if e.path().extension().is_some_and(|x| x == "rs") {
                roots.insert(e.path());
            }
        }
    }
    let mut section = "";
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if matches!(section, "[lib]" | "[[bin]]" | "[[test]]")
            && let Some(rest) = line.strip_prefix("path")
        {
            let path = rest.trim_start_matches([' ', '=']).trim().trim_matches('"');
            roots.insert(dir.join(path));
        }
    }
    roots.into_iter().filter(|p| p.is_file()).collect()
}

/// One crate's modules and who uses whom.
struct Graph {
    /// Module path (`""` for the root, `a::b`) → its file.
    modules: BTreeMap<String, PathBuf>,
    /// (from, to) → the names used.
    edges: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Graph {
    fn of_crate(root: &Path) -> Graph {
        let mut modules = BTreeMap::new();
        let mut sources = BTreeMap::new();
        let mut todo = vec![(String::new(), root.to_path_buf())];
        while let Some((name, file)) = todo.pop() {
            let text = code_only(&std::fs::read_to_string(&file).unwrap_or_default());
            // Where this module's child files live.
            let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
            let base = if name.is_empty() || stem == "mod" {
                file.parent().unwrap().to_path_buf()
            } else {
                file.parent().unwrap().join(&stem)
            };
            for child in declared_mods(&text) {
                let flat = base.join(format!("{child}.rs"));
                let nested = base.join(&child).join("mod.rs");
                let path = if flat.is_file() { flat } else { nested };
                if path.is_file() {
                    todo.push((join(&name, &child), path));
                }
            }
            modules.insert(name.clone(), file);
            sources.insert(name, text);
        }
        // What the root re-exports: item name → the module it comes from.
        let mut reexports: BTreeMap<String, String> = BTreeMap::new();
        let known: BTreeSet<String> = modules.keys().cloned().collect();
        for (path, _) in use_paths(&sources[""], "") {
            if let Some((module, item)) = resolve(&known, &path)
                && !module.is_empty()
                && !item.is_empty()
            {
                reexports.insert(item, module);
            }
        }
        let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (name, text) in &sources {
            for (path, in_inline_mod) in paths_of(text, name, &known) {
                let Some((mut target, item)) = resolve(&known, &path) else {
                    continue;
                };
                let _ = in_inline_mod;
                if target.is_empty()
                    && let Some(m) = reexports.get(&item)
                {
                    target = m.clone();
                }
                if target != *name {
                    edges
                        .entry((name.clone(), target))
                        .or_default()
                        .insert(if item.is_empty() { "*".into() } else { item });
                }
            }
        }
        Graph { modules, edges }
    }

    /// Every strongly connected component of more than one module, as one
    /// cycle through it with the names each step uses.
    fn cycles(&self) -> Vec<String> {
        let names: Vec<&String> = self.modules.keys().collect();
        let index: BTreeMap<&String, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut adj = vec![Vec::new(); names.len()];
        for (from, to) in self.edges.keys() {
            if let (Some(&a), Some(&b)) = (index.get(from), index.get(to)) {
                adj[a].push(b);
            }
        }
        let sccs = tarjan(&adj);
        let mut out = Vec::new();
        for scc in sccs.into_iter().filter(|c| c.len() > 1) {
            let inside: BTreeSet<usize> = scc.iter().copied().collect();
            let start = *scc.iter().min().unwrap();
            // A cycle from `start` back to it inside the component (BFS).
            let mut prev = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut back = None;
            while let Some(n) = queue.pop_front() {
                for &m in &adj[n] {
                    if !inside.contains(&m) {
                        continue;
                    }
                    if m == start {
                        back = Some(n);
                        break;
                    }
                    if let std::collections::btree_map::Entry::Vacant(e) = prev.entry(m) {
                        e.insert(n);
                        queue.push_back(m);
                    }
                }
                if back.is_some() {
                    break;
                }
            }
            let mut cycle = vec![start];
            let mut n = back.expect("a component of two or more has a cycle");
            while n != start {
                cycle.push(n);
                n = prev[&n];
            }
            cycle[1..].reverse();
            cycle.push(start);
            let show = |i: usize| {
                if names[i].is_empty() {
                    "crate".to_owned()
                } else {
                    names[i].clone()
                }
            };
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let used = &self.edges[&(names[w[0]].clone(), names[w[1]].clone())];
                    let used: Vec<&str> = used.iter().map(String::as_str).take(6).collect();
                    format!("{} -> {}: {}", show(w[0]), show(w[1]), used.join(", "))
                })
                .collect();
            let members: Vec<String> = scc.iter().map(|&i| show(i)).collect();
            out.push(format!(
                "circle of {{{}}}: {}",
                members.join(", "),
                steps.join("; ")
            ));
        }
        out
    }
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{parent}::{child}")
    }
}

/// `path` (segments from the crate root) as (the longest module it names,
/// the first segment after it, or "" when the path is the module itself).
fn resolve(known: &BTreeSet<String>, path: &[String]) -> Option<(String, String)> {
    let mut module = String::new();
    let mut used = 0;
    for (i, seg) in path.iter().enumerate() {
        let next = join(&module, seg);
        if known.contains(&next) {
            module = next;
            used = i + 1;
        } else {
            break;
        }
    }
    let item = path.get(used).cloned().unwrap_or_default();
    Some((module, item))
}

/// The source without comments, string and char literals (replaced by
/// spaces, so positions and braces outside them stay).
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && !b
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let mut j = i + if c == 'b' { 2 } else { 1 };
                while b.get(j) == Some(&'#') {
                    j += 1;
                }
                b.get(j) == Some(&'"')
            }
        {
            // Raw string: r"…", r#"…"#, br"…".
            let mut j = i + if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while b[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\''
            && (next == Some('\\') && b.get(i + 3).is_some_and(|_| true)
                || b.get(i + 2) == Some(&'\''))
        {
            // A char literal ('x', '\n', '\u{…}'); a lifetime has no closing quote.
            let mut j = i + 1;
            if b[j] == '\\' {
                j += 1;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
            } else {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Names of `mod x;` declarations (files), not inline `mod x { … }`.
fn declared_mods(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("mod ") {
        if i > 0
            && text[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &text[i + 4..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(';') {
            out.push(name);
        }
    }
    out
}

/// Paths of `use` statements in `text` (module `module`), group-expanded,
/// from the crate root. Used for the root's re-exports.
fn use_paths(text: &str, module: &str) -> Vec<(Vec<String>, bool)> {
    let known = BTreeSet::new();
    paths_of(text, module, &known)
        .into_iter()
        .filter(|(p, _)| !p.is_empty())
        .collect()
}

/// Every path in `text` that names something of this crate, as segments
/// from the crate root, with whether it sits in an inline module.
fn paths_of(text: &str, module: &str, known: &BTreeSet<String>) -> Vec<(Vec<String>, bool)> {
    let chars: Vec<char> = text.chars().collect();
    let inline = inline_mod_spans(&chars);
    let children: BTreeSet<String> = declared_mods(text).into_iter().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i])
            || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':' || chars[i - 1] == '$'))
        {
            i += 1;
            continue;
        }
        let word: String = chars[i..].iter().take_while(|c| is_ident(**c)).collect();
        let after = i + word.len();
        if !(chars.get(after) == Some(&':') && chars.get(after + 1) == Some(&':')) {
            i = after;
            continue;
        }
        let in_inline = inline.iter().any(|(a, b)| (*a..*b).contains(&i));
        let segs: Vec<String> = module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let base: Option<Vec<String>> = match word.as_str() {
            "crate" => Some(vec![]),
            "self" if !in_inline => Some(segs.clone()),
            "super" if in_inline => Some(segs.clone()),
            "super" => {
                let mut s = segs.clone();
                s.pop();
                Some(s)
            }
            w if children.contains(w) && !in_inline => {
                let mut s = segs.clone();
                s.push(w.to_owned());
                // The rest follows from after the name.
                for tail in tails(&chars, after + 2) {
                    let mut p = s.clone();
                    p.extend(tail);
                    out.push((p, in_inline));
                }
                if tails(&chars, after + 2).is_empty() {
                    out.push((s, in_inline));
                }
                i = after;
                continue;
            }
            _ => None,
        };
        if let Some(base) = base {
            let mut j = after + 2;
            let mut base = base;
            // `super::super::…`
            loop {
                let rest: String = chars[j..].iter().take(7).collect();
                if rest.starts_with("super::") {
                    base.pop();
                    j += 7;
                } else {
                    break;
                }
            }
            let ts = tails(&chars, j);
            if ts.is_empty() {
                out.push((base.clone(), in_inline));
            }
            for tail in ts {
                let mut p = base.clone();
                p.extend(tail);
                out.push((p, in_inline));
            }
        }
        let _ = known;
        i = after;
    }
    out
}

/// The path segments from `at`: `a::b::C`, or each path of a `{…}` group.
fn tails(chars: &[char], at: usize) -> Vec<Vec<String>> {
    let mut i = at;
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if chars.get(i) == Some(&'{') {
        // Split the group at top-level commas; each part is a path (maybe grouped).
        let mut depth = 0;
        let mut start = i + 1;
        let mut out = Vec::new();
        let mut j = i;
        while j < chars.len() {
            match chars[j] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.extend(part_paths(chars, start, j));
                        break;
                    }
                }
                ',' if depth == 1 => {
                    out.extend(part_paths(chars, start, j));
                    start = j + 1;
                }
                _ => {}
            }
            j += 1;
        }
        return out;
    }
    let mut segs = Vec::new();
    loop {
        let word: String = chars[i..]
            .iter()
            .take_while(|c| c.is_alphanumeric() || **c == '_')
            .collect();
        if word.is_empty() {
            break;
        }
        i += word.len();
        segs.push(word);
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            if chars.get(i) == Some(&'{') {
                return tails(chars, i)
                    .into_iter()
                    .map(|t| segs.iter().cloned().chain(t).collect())
                    .collect();
            }
        } else {
            break;
        }
    }
    if segs.is_empty() { vec![] } else { vec![segs] }
}

fn part_paths(chars: &[char], start: usize, end: usize) -> Vec<Vec<String>> {
    let mut i = start;
    while i < end && chars[i].is_whitespace() {
        i += 1;
    }
    if i >= end {
        return vec![];
    }
    let word: String = chars[i..end]
        .iter()
        .take_while(|c| c.is_alphanumeric() || **c == '_')
        .collect();
    if word == "self" {
        return vec![vec![]];
    }
    tails(&chars[..end], i)
}

/// Character ranges of inline `mod x { … }` blocks.
fn inline_mod_spans(chars: &[char]) -> Vec<(usize, usize)> {
    let text: String = chars.iter().collect();
    let mut out = Vec::new();
    // Char positions equal byte positions only for ASCII; map via char_indices.
    let byte_to_char: BTreeMap<usize, usize> = text
        .char_indices()
        .enumerate()
        .map(|(ci, (bi, _))| (bi, ci))
        .collect();
    for (bi, _) in text.match_indices("mod ") {
        let ci = byte_to_char[&bi];
        if ci > 0 && (chars[ci - 1].is_alphanumeric() || chars[ci - 1] == '_') {
            continue;
        }
        let mut j = ci + 4;
        while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
            j += 1;
        }
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if chars.get(j) != Some(&'{') {
            continue;
        }
        let mut depth = 0;
        let mut k = j;
        while k < chars.len() {
            match chars[k] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        out.push((ci, k));
    }
    out
}

/// Tarjan's strongly connected components.
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct S<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut S, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &s.adj[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut c = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(c);
        }
    }
    let n = adj.len();
    let mut s = S {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: vec![],
        next: 0,
        out: vec![],
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}
