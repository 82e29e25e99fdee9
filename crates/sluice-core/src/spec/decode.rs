//! Turning document nodes into typed fields while collecting every error, not just the first.

use std::fmt;

use super::document::{Node, NodeKind};

/// One problem in a job document, located by field path and (for YAML) line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpecError {
    /// Dotted field path, e.g. `target.write_mode` or `source.tables[2]`; empty for the document.
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "(document)" } else { &self.path };
        write!(formatter, "{path}")?;
        if let Some(line) = self.line {
            write!(formatter, " (line {line})")?;
        }
        write!(formatter, ": {}", self.message)
    }
}

/// Where the `${NAME}`s of a document take their values: a name's value, or why it has none (a
/// message naming the variable and what to do). `sluice run` reads its own environment; a server
/// only what its operator lets documents read.
pub type Variables<'a> = &'a dyn Fn(&str) -> Result<String, String>;

/// Why `${NAME}` has no value when the environment lacks it.
pub fn unset_variable(name: &str) -> String {
    format!("environment variable `{name}` is not set; export it or change the job file")
}

/// Collects errors while fields are read. Reading methods return `None` after recording an error,
/// so a caller can go on reading the other fields.
#[derive(Default)]
pub struct Decoder<'v> {
    errors: Vec<SpecError>,
    /// Reads `${VAR}`; tests substitute a map.
    variables: Option<Variables<'v>>,
}

impl std::fmt::Debug for Decoder<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("Decoder").field("errors", &self.errors).finish_non_exhaustive()
    }
}

impl<'v> Decoder<'v> {
    pub fn new(variables: Variables<'v>) -> Decoder<'v> {
        Decoder { errors: Vec::new(), variables: Some(variables) }
    }

    pub fn error(&mut self, path: &str, line: Option<usize>, message: impl Into<String>) {
        self.errors.push(SpecError { path: path.to_owned(), line, message: message.into() });
    }

    pub fn into_errors(self) -> Vec<SpecError> {
        self.errors
    }

    /// Opens a mapping and reports every key not in `allowed`.
    pub fn mapping<'a>(&mut self, node: &'a Node, path: &str, allowed: &[&str]) -> Option<Fields<'a>> {
        let NodeKind::Mapping(entries) = &node.kind else {
            self.error(path, node.line, format!("expected a mapping, found {}", node.shape()));
            return None;
        };
        for (key, value) in entries {
            if !allowed.contains(&key.as_str()) {
                self.error(
                    &join(path, key),
                    value.line,
                    format!("unknown field `{key}`; expected one of: {}", allowed.join(", ")),
                );
            }
        }
        Some(Fields { entries, path: path.to_owned(), line: node.line })
    }

    /// Reads a string scalar, substituting `${VAR}` from the environment (`$$` is a literal `$`).
    pub fn string(&mut self, node: &Node, path: &str) -> Option<String> {
        let NodeKind::Scalar { text, .. } = &node.kind else {
            self.error(path, node.line, format!("expected a string, found {}", node.shape()));
            return None;
        };
        self.substitute(text, path, node.line)
    }

    pub fn boolean(&mut self, node: &Node, path: &str) -> Option<bool> {
        match &node.kind {
            NodeKind::Scalar { text, quoted: false } if matches!(text.as_str(), "true" | "True" | "TRUE") => Some(true),
            NodeKind::Scalar { text, quoted: false } if matches!(text.as_str(), "false" | "False" | "FALSE") => {
                Some(false)
            }
            _ => {
                self.error(path, node.line, format!("expected true or false, found {}", describe(node)));
                None
            }
        }
    }

    /// Reads a non-negative integer no larger than `maximum`.
    pub fn unsigned(&mut self, node: &Node, path: &str, maximum: u64) -> Option<u64> {
        let parsed = match &node.kind {
            NodeKind::Scalar { text, quoted: false } => text.replace('_', "").parse::<u64>().ok(),
            _ => None,
        };
        match parsed {
            Some(value) if value <= maximum => Some(value),
            _ => {
                self.error(
                    path,
                    node.line,
                    format!("expected a whole number from 0 to {maximum}, found {}", describe(node)),
                );
                None
            }
        }
    }

    /// Reads a list of strings; a single string is accepted as a one-element list.
    pub(crate) fn string_list(&mut self, node: &Node, path: &str) -> Option<Vec<String>> {
        match &node.kind {
            NodeKind::Scalar { .. } if !node.is_null() => Some(vec![self.string(node, path)?]),
            NodeKind::Sequence(items) => {
                let mut values = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    if let Some(value) = self.string(item, &format!("{path}[{index}]")) {
                        values.push(value);
                    }
                }
                Some(values)
            }
            _ => {
                self.error(path, node.line, format!("expected a list of strings, found {}", node.shape()));
                None
            }
        }
    }

    /// The node with `${VAR}` substituted in every scalar under it (a connector's own options
    /// take environment variables as the common fields do); an error is recorded for each
    /// variable that is not set, and its scalar is kept as written.
    pub(crate) fn substituted(&mut self, node: &Node, path: &str) -> Node {
        let kind = match &node.kind {
            NodeKind::Scalar { text, quoted } => NodeKind::Scalar {
                text: self.substitute(text, path, node.line).unwrap_or_else(|| text.clone()),
                quoted: *quoted,
            },
            NodeKind::Sequence(items) => NodeKind::Sequence(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| self.substituted(item, &format!("{path}[{index}]")))
                    .collect(),
            ),
            NodeKind::Mapping(entries) => NodeKind::Mapping(
                entries.iter().map(|(key, value)| (key.clone(), self.substituted(value, &join(path, key)))).collect(),
            ),
        };
        Node { kind, line: node.line }
    }

    fn substitute(&mut self, text: &str, path: &str, line: Option<usize>) -> Option<String> {
        if !text.contains('$') {
            return Some(text.to_owned());
        }
        let mut output = String::with_capacity(text.len());
        let mut rest = text;
        let mut ok = true;
        while let Some(at) = rest.find('$') {
            output.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(after_dollar) = after.strip_prefix('$') {
                output.push('$');
                rest = after_dollar;
            } else if let Some(body) = after.strip_prefix('{') {
                let Some(end) = body.find('}') else {
                    self.error(path, line, "unclosed `${` in value; write `$$` for a literal `$`");
                    return None;
                };
                let name = &body[..end];
                let value = match self.variables {
                    _ if !is_variable_name(name) => {
                        Err(format!("`${{{name}}}` is not a valid environment variable name"))
                    }
                    Some(variables) => variables(name),
                    None => Err(unset_variable(name)),
                };
                match value {
                    Ok(value) => output.push_str(&value),
                    Err(message) => {
                        self.error(path, line, message);
                        ok = false;
                    }
                }
                rest = &body[end + 1..];
            } else {
                output.push('$');
                rest = after;
            }
        }
        output.push_str(rest);
        ok.then_some(output)
    }
}

/// Whether a value as written is one whole `${VARIABLE}` (a secret given by reference, not
/// written out).
pub fn is_placeholder(text: &str) -> bool {
    text.starts_with("${") && text.ends_with('}') && text.matches("${").count() == 1
}

/// Whether `name` may be a variable's: letters, digits and `_` (so it is also a plain file name).
pub fn is_variable_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
}

/// Describes a node for messages; scalars are quoted as written, so the user sees what they
/// wrote and a `${VAR}` is shown as `${VAR}`, never as the value it expands to.
pub fn describe(node: &Node) -> String {
    match &node.kind {
        NodeKind::Scalar { text, .. } if !node.is_null() => format!("`{text}`"),
        _ => node.shape().to_owned(),
    }
}

/// Joins a field path and a key.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// The entries of a mapping, looked up by key.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    entries: &'a [(String, Node)],
    path: String,
    line: Option<usize>,
}

impl<'a> Fields<'a> {
    /// The value of `key`, treating an explicit null as absent.
    pub fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries.iter().find(|(name, _)| name == key).map(|(_, node)| node).filter(|node| !node.is_null())
    }

    /// The value of `key`, or an error naming the missing field.
    pub fn require(&self, decoder: &mut Decoder, key: &str, what: &str) -> Option<&'a Node> {
        let node = self.get(key);
        if node.is_none() {
            decoder.error(&self.path(key), self.line, format!("missing required field `{key}` ({what})"));
        }
        node
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The keys present, with their lines.
    pub fn keys(&self) -> impl Iterator<Item = (&'a str, Option<usize>)> + '_ {
        self.entries.iter().filter(|(_, node)| !node.is_null()).map(|(key, node)| (key.as_str(), node.line))
    }
}
