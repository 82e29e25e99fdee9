//! `placement:`: which cluster nodes may run a job's tasks, by the zone and labels a node is
//! started with (`sluice server --zone dc1 --label disk=ssd`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::decode::{join, Decoder};
use super::document::{Node, NodeKind};

/// The zone and labels a node must carry to claim a job's tasks; empty: any node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Each label the node must carry, with this value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Placement {
    /// Whether a node of `zone` carrying `labels` may run the job's tasks.
    pub fn admits(&self, zone: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
        self.zone.as_deref().is_none_or(|wanted| zone == Some(wanted))
            && self.labels.iter().all(|(name, value)| labels.get(name) == Some(value))
    }

    pub fn is_any(&self) -> bool {
        self.zone.is_none() && self.labels.is_empty()
    }
}

/// `zone east, label disk=ssd`, for messages.
impl fmt::Display for Placement {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.zone.iter().map(|zone| format!("zone {zone}")).collect();
        parts.extend(self.labels.iter().map(|(name, value)| format!("label {name}={value}")));
        if parts.is_empty() {
            parts.push("any node".to_owned());
        }
        formatter.write_str(&parts.join(", "))
    }
}

/// Whether `text` may name a zone or a label (or a label's value): letters, digits, `-`, `_`,
/// `.`, as Kubernetes labels.
pub fn is_placement_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.chars().all(|character| character.is_ascii_alphanumeric() || "-_.".contains(character))
}

/// `placement: {zone: Z, labels: {NAME: VALUE, …}}`, every problem reported.
pub(super) fn decode_placement(decoder: &mut Decoder, node: &Node) -> Option<Placement> {
    let fields = decoder.mapping(node, "placement", &["zone", "labels"])?;
    let mut placement = Placement::default();
    let mut valid = true;
    if let Some(zone) = fields.get("zone") {
        let text = decoder.string(zone, "placement.zone");
        placement.zone = word(decoder, text, "placement.zone", zone.line);
        valid &= placement.zone.is_some();
    }
    if let Some(labels) = fields.get("labels") {
        let NodeKind::Mapping(entries) = &labels.kind else {
            decoder.error(
                "placement.labels",
                labels.line,
                format!("expected a mapping of label names to values, found {}", labels.shape()),
            );
            return None;
        };
        for (name, value) in entries {
            let path = join("placement.labels", name);
            let name = word(decoder, Some(name.clone()), &path, value.line);
            let text = decoder.string(value, &path);
            let value = word(decoder, text, &path, value.line);
            match (name, value) {
                (Some(name), Some(value)) => {
                    placement.labels.insert(name, value);
                }
                _ => valid = false,
            }
        }
    }
    valid.then_some(placement)
}

/// `text` if it is a zone or label word; else reported at `path`.
fn word(decoder: &mut Decoder, text: Option<String>, path: &str, line: Option<usize>) -> Option<String> {
    let text = text?;
    if is_placement_word(&text) {
        return Some(text);
    }
    decoder.error(
        path,
        line,
        format!("`{text}` is not a zone or label word: 1 to 63 letters, digits, `-`, `_` or `.`"),
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_admitted_by_its_zone_and_every_label_asked() {
        let labels: BTreeMap<String, String> = [("disk".to_owned(), "ssd".to_owned())].into();
        let east = Placement { zone: Some("east".into()), labels: labels.clone() };
        assert!(east.admits(Some("east"), &labels));
        assert!(!east.admits(Some("west"), &labels), "another zone");
        assert!(!east.admits(None, &labels), "a node without a zone");
        assert!(!east.admits(Some("east"), &BTreeMap::new()), "a label missing");
        assert!(Placement::default().admits(None, &BTreeMap::new()), "no placement: any node");
        assert_eq!(east.to_string(), "zone east, label disk=ssd");
    }
}
