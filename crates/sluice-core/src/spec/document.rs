//! A job document as a tree of nodes that remember their line, built from YAML or JSON, so that
//! every validation error can name the field path and the YAML line.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// A node of the document tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    /// 1-based line in the YAML text; `None` for JSON documents.
    pub line: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// A scalar's text, and whether it was quoted (a quoted `"4"` is a string, never a number).
    Scalar {
        text: String,
        quoted: bool,
    },
    Sequence(Vec<Node>),
    /// Entries in document order.
    Mapping(Vec<(String, Node)>),
}

impl Node {
    /// True for YAML's plain `null`, `~` and empty scalars and JSON's `null`.
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, NodeKind::Scalar { text, quoted: false } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// A short description of the node's shape for "expected X, found Y" messages.
    pub fn shape(&self) -> &'static str {
        match &self.kind {
            _ if self.is_null() => "null",
            NodeKind::Scalar { .. } => "a scalar",
            NodeKind::Sequence(_) => "a list",
            NodeKind::Mapping(_) => "a mapping",
        }
    }
}

/// A document that could not be parsed at all.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

/// Parses YAML into a node tree. Anchors and aliases are resolved; duplicate keys are errors.
pub fn parse_yaml(text: &str) -> Result<Node, SyntaxError> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|error| SyntaxError {
            line: Some(error.marker().line()),
            column: Some(error.marker().col() + 1),
            message: error.info().to_owned(),
        })?;
        builder.accept(event, span)?;
    }
    builder.finish()
}

/// Parses JSON into a node tree (without line numbers).
pub fn parse_json(text: &str) -> Result<Node, SyntaxError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|error| SyntaxError {
        line: Some(error.line()),
        column: Some(error.column()),
        message: error.to_string(),
    })?;
    Ok(from_json(value))
}

/// A node tree as JSON: plain YAML scalars that read as booleans, null or numbers become those,
/// every other scalar a string; so `parse_json(to_json(parse_yaml(text)))` decodes to the same
/// job as the YAML text.
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value;
    match &node.kind {
        _ if node.is_null() => Value::Null,
        NodeKind::Scalar { text, quoted: true } => Value::String(text.clone()),
        NodeKind::Scalar { text, quoted: false } => match text.as_str() {
            "true" | "True" | "TRUE" => Value::Bool(true),
            "false" | "False" | "FALSE" => Value::Bool(false),
            _ => text
                .parse::<i64>()
                .map(Value::from)
                .ok()
                .or_else(|| text.parse::<u64>().map(Value::from).ok())
                .or_else(|| text.parse::<f64>().ok().filter(|number| number.is_finite()).map(Value::from))
                .unwrap_or_else(|| Value::String(text.clone())),
        },
        NodeKind::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        NodeKind::Mapping(entries) => {
            Value::Object(entries.iter().map(|(key, value)| (key.clone(), to_json(value))).collect())
        }
    }
}

fn from_json(value: serde_json::Value) -> Node {
    let scalar = |text: String, quoted: bool| NodeKind::Scalar { text, quoted };
    let kind = match value {
        serde_json::Value::Null => scalar("null".into(), false),
        serde_json::Value::Bool(value) => scalar(value.to_string(), false),
        serde_json::Value::Number(value) => scalar(value.to_string(), false),
        serde_json::Value::String(value) => scalar(value, true),
        serde_json::Value::Array(items) => NodeKind::Sequence(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(entries) => {
            NodeKind::Mapping(entries.into_iter().map(|(key, value)| (key, from_json(value))).collect())
        }
    };
    Node { kind, line: None }
}

/// The most nodes a document may hold once its aliases are expanded: a job file has a few
/// hundred; a "billion laughs" document is refused before it takes memory or time.
const MAX_NODES: usize = 100_000;
/// The deepest nesting of collections a document may have.
const MAX_DEPTH: usize = 64;

/// Folds parser events into nodes with a stack of open collections.
#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    /// Each anchor's node and how many nodes it holds.
    anchors: HashMap<usize, (Node, usize)>,
    root: Option<Node>,
    /// Nodes made so far, aliases counted at their expanded size.
    nodes: usize,
}

struct Open {
    node: Node,
    anchor: usize,
    /// `nodes` when the collection opened.
    nodes_before: usize,
    /// For mappings: the key read, waiting for its value.
    pending_key: Option<(String, usize)>,
}

impl Builder {
    fn accept(&mut self, event: Event<'_>, span: Span) -> Result<(), SyntaxError> {
        let line = Some(span.start.line());
        match event {
            Event::MappingStart(anchor, _) => self.open(NodeKind::Mapping(Vec::new()), anchor, span)?,
            Event::SequenceStart(anchor, _) => self.open(NodeKind::Sequence(Vec::new()), anchor, span)?,
            Event::MappingEnd | Event::SequenceEnd => {
                let open = self.stack.pop().expect("the parser balances collections");
                let size = self.nodes - open.nodes_before;
                self.add(open.node, open.anchor, size, span)?;
            }
            Event::Scalar(text, style, anchor, _) => {
                let quoted = !matches!(style, ScalarStyle::Plain);
                let node = Node { kind: NodeKind::Scalar { text: text.into_owned(), quoted }, line };
                self.count(1, span)?;
                self.add(node, anchor, 1, span)?;
            }
            Event::Alias(anchor) => {
                let (node, size) = self.anchors.get(&anchor).cloned().ok_or_else(|| SyntaxError {
                    line,
                    column: Some(span.start.col() + 1),
                    message: "alias refers to an unknown anchor".into(),
                })?;
                self.count(size, span)?;
                self.add(node, 0, size, span)?;
            }
            Event::DocumentStart(_) if self.root.is_some() => {
                return Err(SyntaxError {
                    line,
                    column: Some(1),
                    message: "a job file holds one document; found a second `---`".into(),
                });
            }
            _ => {}
        }
        Ok(())
    }

    fn open(&mut self, kind: NodeKind, anchor: usize, span: Span) -> Result<(), SyntaxError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(SyntaxError {
                line: Some(span.start.line()),
                column: Some(span.start.col() + 1),
                message: format!("collections nest deeper than {MAX_DEPTH} levels"),
            });
        }
        self.count(1, span)?;
        let line = Some(span.start.line());
        self.stack.push(Open { node: Node { kind, line }, anchor, nodes_before: self.nodes - 1, pending_key: None });
        Ok(())
    }

    /// Counts `size` more nodes, refusing a document that grows past `MAX_NODES`.
    fn count(&mut self, size: usize, span: Span) -> Result<(), SyntaxError> {
        self.nodes = self.nodes.saturating_add(size);
        if self.nodes > MAX_NODES {
            return Err(SyntaxError {
                line: Some(span.start.line()),
                column: Some(span.start.col() + 1),
                message: format!(
                    "the document expands to more than {MAX_NODES} values (through YAML aliases?); a job is far smaller"
                ),
            });
        }
        Ok(())
    }

    fn add(&mut self, node: Node, anchor: usize, size: usize, span: Span) -> Result<(), SyntaxError> {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some(parent) = self.stack.last_mut() else {
            self.root = Some(node);
            return Ok(());
        };
        match &mut parent.node.kind {
            NodeKind::Sequence(items) => items.push(node),
            NodeKind::Mapping(entries) => match parent.pending_key.take() {
                None => match node.kind {
                    NodeKind::Scalar { text, .. } => parent.pending_key = Some((text, span.start.line())),
                    _ => {
                        return Err(SyntaxError {
                            line: node.line,
                            column: Some(span.start.col() + 1),
                            message: "mapping keys must be plain strings".into(),
                        })
                    }
                },
                Some((key, key_line)) => {
                    if entries.iter().any(|(existing, _)| *existing == key) {
                        return Err(SyntaxError {
                            line: Some(key_line),
                            column: None,
                            message: format!("duplicate key `{key}`"),
                        });
                    }
                    // A value's line is its key's line: that is where a reader looks.
                    let node = Node { line: Some(key_line), ..node };
                    entries.push((key, node));
                }
            },
            NodeKind::Scalar { .. } => unreachable!("scalars are never open"),
        }
        Ok(())
    }

    fn finish(self) -> Result<Node, SyntaxError> {
        self.root.ok_or_else(|| SyntaxError { line: Some(1), column: Some(1), message: "the document is empty".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_nodes_carry_the_line_of_their_key() {
        let node = parse_yaml("name: a\nsource:\n  type: sqlite\n  tables: [\"x\", y]\n").unwrap();
        let NodeKind::Mapping(entries) = &node.kind else { panic!("root is a mapping") };
        assert_eq!(entries[0].0, "name");
        assert_eq!(entries[1].1.line, Some(2));
        let NodeKind::Mapping(source) = &entries[1].1.kind else { panic!("source is a mapping") };
        assert_eq!(source[1].1.line, Some(4));
        let NodeKind::Sequence(tables) = &source[1].1.kind else { panic!("tables is a list") };
        assert_eq!(tables[0].kind, NodeKind::Scalar { text: "x".into(), quoted: true });
        assert_eq!(tables[1].kind, NodeKind::Scalar { text: "y".into(), quoted: false });
    }

    #[test]
    fn malformed_yaml_reports_line_and_column() {
        let error = parse_yaml("name: a\nsource: [unclosed\ntarget: b\n").unwrap_err();
        assert!(error.line.is_some() && error.column.is_some(), "{error:?}");
        let error = parse_yaml("a: 1\na: 2\n").unwrap_err();
        assert_eq!((error.line, error.message.as_str()), (Some(2), "duplicate key `a`"));
    }

    #[test]
    fn a_billion_laughs_is_refused_quickly() {
        let mut text =
            String::from("a0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n");
        for level in 1..10 {
            let previous = level - 1;
            let items = vec![format!("*a{previous}"); 9].join(", ");
            text.push_str(&format!("a{level}: &a{level} [{items}]\n"));
        }
        let started = std::time::Instant::now();
        let error = parse_yaml(&text).expect_err("refused");
        assert!(error.message.contains("more than 100000 values"), "{}", error.message);
        // Refused after counting 100,000 values, not after building a billion (generous for a
        // debug build on a busy machine).
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse_yaml(&deep).expect_err("refused").message.contains("nest deeper"));
    }

    #[test]
    fn aliases_resolve_to_their_anchor() {
        let node = parse_yaml("base: &b {x: 1}\ncopy: *b\n").unwrap();
        let NodeKind::Mapping(entries) = &node.kind else { panic!() };
        assert_eq!(entries[0].1.kind, entries[1].1.kind);
    }
}
