//! The workspace's layering, read from its source: connectors see only the contract, the
//! contract sees nothing of the engine, the cluster never reaches into the API, and no file
//! imports a file that imports it back (directly or around a loop).
//!
//! A file's imports are the `crate::`, `super::`, `self::` and `sluice_core::` paths it names
//! outside its unit tests, resolved to the file of the module they name. A module and the files
//! of its own folder (`mysql/mod.rs` and `mysql/source.rs`) are one unit: their arrows are not
//! counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules of `sluice-core` a connector may name: the contract and its shared helpers.
const CONTRACT: &[&str] = &[
    "change",
    "clock",
    "conflict",
    "connector",
    "cursor",
    "error",
    "failpoint",
    "filter",
    "json",
    "names",
    "schema",
    "secret",
    "spec",
    "value",
];

/// One source file: its crate, its module path, and the paths it names.
#[derive(Debug)]
struct SourceFile {
    path: PathBuf,
    krate: String,
    module: Vec<String>,
    paths: Vec<Vec<String>>,
    /// The macros the file exports (`#[macro_export]`): Rust puts them at the crate's root, so
    /// a path to one names the crate, not the file that defines it.
    macros: Vec<String>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every `.rs` file of each crate's `src/` (binaries under `src/bin/` are crates of their own
/// and are left out).
fn source_files() -> Vec<SourceFile> {
    let mut files = Vec::new();
    let crates = workspace().join("crates");
    for entry in std::fs::read_dir(&crates).unwrap() {
        let root = entry.unwrap().path().join("src");
        if !root.is_dir() {
            continue;
        }
        let krate = root.parent().unwrap().file_name().unwrap().to_string_lossy().replace('-', "_");
        let mut pending = vec![root.clone()];
        while let Some(directory) = pending.pop() {
            for entry in std::fs::read_dir(&directory).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    if path != root.join("bin") {
                        pending.push(path);
                    }
                } else if path.extension().is_some_and(|extension| extension == "rs") {
                    let module = module_of(&root, &path);
                    let text = std::fs::read_to_string(&path).unwrap();
                    files.push(SourceFile {
                        paths: named_paths(&without_tests(&text)),
                        macros: exported_macros(&text),
                        path,
                        krate: krate.clone(),
                        module,
                    });
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// The names of the macros `text` exports.
fn exported_macros(text: &str) -> Vec<String> {
    text.split("#[macro_export]")
        .skip(1)
        .filter_map(|after| after.trim_start().strip_prefix("macro_rules!"))
        .filter_map(|rest| {
            rest.split(|character: char| !(character.is_alphanumeric() || character == '_'))
                .find(|name| !name.is_empty())
        })
        .map(str::to_owned)
        .collect()
}

/// `lib.rs` / `main.rs` → [], `a/mod.rs` → [a], `a/b.rs` → [a, b].
fn module_of(root: &Path, path: &Path) -> Vec<String> {
    let relative = path.strip_prefix(root).unwrap().with_extension("");
    let mut module: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        module.pop();
    }
    module
}

/// The text without comments, string and character literals and `#[cfg(test)]` items.
fn without_tests(text: &str) -> String {
    let characters: Vec<char> = text.chars().collect();
    let mut code = String::with_capacity(text.len());
    let mut index = 0;
    let at = |index: usize| characters.get(index).copied().unwrap_or('\0');
    while index < characters.len() {
        match characters[index] {
            '/' if at(index + 1) == '/' => {
                while index < characters.len() && characters[index] != '\n' {
                    index += 1;
                }
            }
            '/' if at(index + 1) == '*' => {
                index += 2;
                while index < characters.len() && !(characters[index] == '*' && at(index + 1) == '/') {
                    index += 1;
                }
                index += 2;
            }
            // A raw string: `r"..."`, `r#"..."#`.
            'r' if (at(index + 1) == '"' || at(index + 1) == '#') && !at(index.wrapping_sub(1)).is_alphanumeric() => {
                let hashes = characters[index + 1..].iter().take_while(|&&character| character == '#').count();
                if at(index + 1 + hashes) != '"' {
                    code.push('r');
                    index += 1;
                    continue;
                }
                index += 2 + hashes;
                let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                while index < characters.len() && !characters[index..].starts_with(&closing) {
                    index += 1;
                }
                index += closing.len();
                code.push_str("\"\"");
            }
            '"' => {
                index += 1;
                while index < characters.len() && characters[index] != '"' {
                    index += if characters[index] == '\\' { 2 } else { 1 };
                }
                index += 1;
                code.push_str("\"\"");
            }
            // A character literal (`'"'`, `'\''`), not a lifetime.
            '\'' if at(index + 1) == '\\' || at(index + 2) == '\'' => {
                index += 1;
                if at(index) == '\\' {
                    index += 1;
                }
                index += 1;
                while index < characters.len() && characters[index] != '\'' {
                    index += 1;
                }
                index += 1;
                code.push_str("' '");
            }
            character => {
                code.push(character);
                index += 1;
            }
        }
    }
    // Drop each `#[cfg(test)]` item: up to its matching closing brace, or its `;`.
    while let Some(start) = code.find("#[cfg(test)]") {
        let rest = &code[start..];
        let mut depth = 0usize;
        let mut end = rest.len();
        for (index, character) in rest.char_indices() {
            match character {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = index + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = index + 1;
                    break;
                }
                _ => {}
            }
        }
        code.replace_range(start..start + end, "");
    }
    code
}

/// Every path the code names that starts at `crate`, `super`, `self` or `sluice_core`, with
/// `use` trees (`a::{b, c::d}`) expanded.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let identifier = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let mut index = 0;
    while index < bytes.len() {
        let starts_word = index == 0 || !(identifier(bytes[index - 1]) || bytes[index - 1] == b':');
        let root =
            ["crate::", "super::", "self::", "sluice_core::"].into_iter().find(|root| code[index..].starts_with(root));
        match root {
            Some(_) if starts_word => {
                // The path, with any `{...}` group it opens, as far as it goes.
                let mut end = index;
                let mut depth = 0usize;
                while end < bytes.len() {
                    let byte = bytes[end];
                    if byte == b'{' {
                        depth += 1;
                    } else if byte == b'}' {
                        if depth == 0 {
                            break;
                        }
                        depth -= 1;
                        if depth == 0 {
                            end += 1;
                            break;
                        }
                    } else if depth == 0 && !(identifier(byte) || byte == b':') {
                        break;
                    }
                    end += 1;
                }
                expand(&code[index..end], &mut Vec::new(), &mut paths);
                index = end.max(index + 1);
            }
            _ => index += 1,
        }
    }
    paths
}

/// Expands a use tree (`a::{b, c::{d, e}}`) under `prefix` into whole paths.
fn expand(tree: &str, prefix: &mut Vec<String>, paths: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let (head, group) = match tree.find('{') {
        Some(open) => (&tree[..open], Some(&tree[open + 1..tree.rfind('}').unwrap_or(tree.len())])),
        None => (tree, None),
    };
    let depth = prefix.len();
    prefix.extend(head.split("::").map(str::trim).filter(|part| !part.is_empty() && *part != "*").map(str::to_owned));
    match group {
        None => paths.push(prefix.clone()),
        Some(group) => {
            let mut level = 0usize;
            let mut start = 0;
            for (index, character) in group.char_indices() {
                match character {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        expand(&group[start..index], prefix, paths);
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            expand(&group[start..], prefix, paths);
        }
    }
    prefix.truncate(depth);
}

/// The module (of `krate`) a path named in `file` leads to: the longest prefix that is a file.
fn resolve<'a>(
    file: &SourceFile,
    path: &[String],
    modules: &'a BTreeMap<(String, Vec<String>), usize>,
) -> Option<(&'a (String, Vec<String>), usize)> {
    let (krate, mut absolute) = match path.first().map(String::as_str) {
        Some("crate") => (file.krate.clone(), Vec::new()),
        Some("sluice_core") => ("sluice_core".to_owned(), Vec::new()),
        Some("self" | "super") => (file.krate.clone(), file.module.clone()),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        absolute.pop();
        while rest.first().map(String::as_str) == Some("super") {
            absolute.pop();
            rest = &rest[1..];
        }
    }
    absolute.extend(rest.iter().cloned());
    (0..=absolute.len())
        .rev()
        .find_map(|length| modules.get_key_value(&(krate.clone(), absolute[..length].to_vec())))
        .map(|(key, &index)| (key, index))
}

fn is_within(inner: &[String], outer: &[String]) -> bool {
    inner.len() >= outer.len() && inner[..outer.len()] == *outer
}

/// Each file with the files it imports (parent modules and their own folders apart).
fn imports(files: &[SourceFile]) -> Vec<BTreeMap<usize, BTreeSet<String>>> {
    let modules: BTreeMap<(String, Vec<String>), usize> =
        files.iter().enumerate().map(|(index, file)| ((file.krate.clone(), file.module.clone()), index)).collect();
    files
        .iter()
        .map(|file| {
            let mut arrows: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
            for path in &file.paths {
                let Some(((krate, module), target)) = resolve(file, path, &modules) else { continue };
                let same_unit =
                    *krate == file.krate && (is_within(module, &file.module) || is_within(&file.module, module));
                if !same_unit {
                    arrows.entry(target).or_default().insert(path.join("::"));
                }
            }
            arrows
        })
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace()).unwrap_or(path).display().to_string()
}

/// The problems of the layering, every one of them.
fn layering_problems(files: &[SourceFile]) -> Vec<String> {
    let is_contract = |file: &SourceFile| {
        file.krate == "sluice_core" && file.module.first().is_some_and(|top| CONTRACT.contains(&top.as_str()))
    };
    // A macro a contract file exports is the contract's, though its path names the crate root.
    let contract_macros: BTreeSet<&str> =
        files.iter().filter(|file| is_contract(file)).flat_map(|file| file.macros.iter().map(String::as_str)).collect();
    let mut problems = Vec::new();
    for file in files {
        let contract_file = is_contract(file);
        for path in &file.paths {
            let Some(second) = path.get(1) else { continue };
            let first_is_module =
                second.chars().next().is_some_and(char::is_lowercase) && !contract_macros.contains(second.as_str());
            if file.krate == "sluice_connectors"
                && path[0] == "sluice_core"
                && first_is_module
                && !CONTRACT.contains(&second.as_str())
            {
                problems.push(format!(
                    "{}: a connector names `{}`, which is the engine's: move what it needs into the contract ({})",
                    relative(&file.path),
                    path.join("::"),
                    CONTRACT.join(", ")
                ));
            }
            if contract_file && path[0] == "crate" && first_is_module && !CONTRACT.contains(&second.as_str()) {
                problems.push(format!(
                    "{}: the contract names `{}`, which is the engine's (connectors would reach it through the contract)",
                    relative(&file.path),
                    path.join("::")
                ));
            }
            let in_cluster =
                file.krate == "sluice" && file.module.first().is_some_and(|top| top == "cluster" || top == "alarms");
            if in_cluster && path[0] == "crate" && second == "api" {
                problems.push(format!(
                    "{}: the cluster names `{}`: the API presents the cluster, never the other way",
                    relative(&file.path),
                    path.join("::")
                ));
            }
        }
    }
    problems
}

/// The loops of imports: each strongly connected set of two files or more (Tarjan).
fn loops(arrows: &[BTreeMap<usize, BTreeSet<String>>]) -> Vec<Vec<usize>> {
    struct Search<'a> {
        arrows: &'a [BTreeMap<usize, BTreeSet<String>>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Search<'_> {
        fn visit(&mut self, node: usize) {
            self.index[node] = Some(self.next);
            self.low[node] = self.next;
            self.next += 1;
            self.stack.push(node);
            self.on_stack[node] = true;
            for &target in self.arrows[node].keys() {
                match self.index[target] {
                    None => {
                        self.visit(target);
                        self.low[node] = self.low[node].min(self.low[target]);
                    }
                    Some(index) if self.on_stack[target] => self.low[node] = self.low[node].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[node]) == self.index[node] {
                let mut members = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack[member] = false;
                    members.push(member);
                    if member == node {
                        break;
                    }
                }
                if members.len() > 1 {
                    members.sort_unstable();
                    self.found.push(members);
                }
            }
        }
    }
    let count = arrows.len();
    let mut search = Search {
        arrows,
        index: vec![None; count],
        low: vec![0; count],
        stack: Vec::new(),
        on_stack: vec![false; count],
        next: 0,
        found: Vec::new(),
    };
    for node in 0..count {
        if search.index[node].is_none() {
            search.visit(node);
        }
    }
    search.found
}

#[test]
fn connectors_see_only_the_contract_and_the_cluster_never_the_api() {
    let files = source_files();
    assert!(files.len() > 100, "the workspace's source was not found: {} files", files.len());
    let problems = layering_problems(&files);
    assert!(problems.is_empty(), "{} layering problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let files = source_files();
    let arrows = imports(&files);
    assert!(arrows.iter().map(BTreeMap::len).sum::<usize>() > 100, "too few imports read: the reader is broken");
    let found = loops(&arrows);
    let (files, arrows) = (&files, &arrows);
    let described: Vec<String> = found
        .iter()
        .map(|members| {
            let lines: Vec<String> = members
                .iter()
                .flat_map(|&from| {
                    arrows[from].iter().filter(|(to, _)| members.contains(to)).map(move |(&to, names)| {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        format!(
                            "  {} -> {}: {}",
                            relative(&files[from].path),
                            relative(&files[to].path),
                            names.join(", ")
                        )
                    })
                })
                .collect();
            lines.join("\n")
        })
        .collect();
    assert!(found.is_empty(), "{} import loop(s):\n{}", found.len(), described.join("\n\n"));
}

#[test]
fn the_reader_finds_what_a_planted_import_breaks() {
    // The checks above fail on what they are meant to catch: an engine import in a connector, and
    // two files that import each other.
    let planted = |module: &[&str], krate: &str, text: &str| SourceFile {
        path: PathBuf::from(format!("planted/{}.rs", module.join("/"))),
        krate: krate.to_owned(),
        module: module.iter().map(|part| part.to_string()).collect(),
        paths: named_paths(&without_tests(text)),
        macros: exported_macros(text),
    };
    let connector = planted(
        &["kafka"],
        "sluice_connectors",
        "use sluice_core::runner::Runner;\nuse sluice_core::{Row, change::Change};",
    );
    let problems = layering_problems(&[connector]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("sluice_core::runner::Runner"), "{problems:?}");
    let cluster = planted(&["cluster", "node"], "sluice", "fn f() { crate::api::views::job_view(); }");
    assert_eq!(layering_problems(&[cluster]).len(), 1);
    // A macro the contract exports is the contract's; one the engine exports is not.
    let exported = "#[macro_export]\nmacro_rules! answers { () => { $crate::connector::Split }; }";
    let contract = planted(&["connector"], "sluice_core", exported);
    let engine = planted(&["runner"], "sluice_core", &exported.replace("answers", "runs"));
    let user = planted(&["kafka"], "sluice_connectors", "sluice_core::answers!();\nsluice_core::runs!();");
    let problems = layering_problems(&[contract, engine, user]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("sluice_core::runs"), "{problems:?}");

    let a = planted(&["a"], "sluice_core", "use crate::b::{B, c::C};\n#[cfg(test)]\nmod tests { use crate::c::D; }\n");
    let b = planted(
        &["b"],
        "sluice_core",
        "// crate::a is only a comment\nfn f() { let _ = \"crate::a\"; crate::a::f(); }",
    );
    let c = planted(&["b", "c"], "sluice_core", "use super::B;");
    let files = [a, b, c];
    let arrows = imports(&files);
    assert_eq!(arrows[0].keys().copied().collect::<Vec<_>>(), [1, 2], "{arrows:?}");
    assert_eq!(arrows[1].keys().copied().collect::<Vec<_>>(), [0], "{arrows:?}");
    assert!(arrows[2].is_empty(), "a module's own folder is one unit with it: {arrows:?}");
    assert_eq!(loops(&arrows), [vec![0, 1]]);
}
