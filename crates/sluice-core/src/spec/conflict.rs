//! `conflict:`: what a change stream does when the target's row is not the one the change
//! started from (someone else wrote it: the other side of a two-way pair, or a hand on the
//! target).

use std::fmt;

use super::decode::Decoder;
use super::document::{Node, NodeKind};

/// The conflict policy of a job (`conflict: source_wins | target_wins | stop` or
/// `conflict: {newer_wins: COLUMN}`). Every conflict is kept as a dirty record with both rows,
/// whichever side wins.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ConflictPolicy {
    /// The change is applied over the target's row.
    SourceWins,
    /// The target's row stays; the change is passed over.
    TargetWins,
    /// The row whose `COLUMN` holds the greater value stays (the change on a tie).
    NewerWins(String),
    /// The stream stops before the change, naming the table, the key and both rows.
    #[default]
    Stop,
}

impl fmt::Display for ConflictPolicy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictPolicy::SourceWins => formatter.write_str("source_wins"),
            ConflictPolicy::TargetWins => formatter.write_str("target_wins"),
            ConflictPolicy::NewerWins(column) => write!(formatter, "newer_wins: {column}"),
            ConflictPolicy::Stop => formatter.write_str("stop"),
        }
    }
}

const EXPECTED: &str = "expected source_wins, target_wins, stop or {newer_wins: COLUMN}";

/// `conflict:` as a word or `{newer_wins: COLUMN}` (also the text `newer_wins: COLUMN`).
pub(super) fn decode_conflict(decoder: &mut Decoder, node: &Node) -> Option<ConflictPolicy> {
    let newer = |decoder: &mut Decoder, column: &str, line| {
        let column = column.trim();
        if column.is_empty() {
            decoder.error("conflict.newer_wins", line, "expected the name of the column that dates each row");
            return None;
        }
        Some(ConflictPolicy::NewerWins(column.to_owned()))
    };
    match &node.kind {
        NodeKind::Mapping(entries) => {
            let fields = decoder.mapping(node, "conflict", &["newer_wins"])?;
            let Some(column) = fields.get("newer_wins") else {
                let found: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
                decoder.error("conflict", node.line, format!("{EXPECTED}, found a mapping of {}", found.join(", ")));
                return None;
            };
            let text = decoder.string(column, "conflict.newer_wins")?;
            newer(decoder, &text, column.line)
        }
        _ => {
            let text = decoder.string(node, "conflict")?;
            match text.trim() {
                "source_wins" => Some(ConflictPolicy::SourceWins),
                "target_wins" => Some(ConflictPolicy::TargetWins),
                "stop" => Some(ConflictPolicy::Stop),
                other => match other.strip_prefix("newer_wins:") {
                    Some(column) => newer(decoder, column, node.line),
                    None => {
                        decoder.error("conflict", node.line, format!("{EXPECTED}, found `{other}`"));
                        None
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{parse_job, JobSpec, SchemaChanges, SpecError};

    fn job(extra: &str) -> Result<JobSpec, Vec<SpecError>> {
        let text = format!(
            "name: pair\nmode: cdc\n{extra}source: {{type: mysql, url: \"mysql://a\"}}\ntarget: {{type: mysql, url: \"mysql://b\"}}\n"
        );
        parse_job(&text, false, |_| None)
    }

    #[test]
    fn a_policy_is_a_word_or_newer_wins_with_its_column_and_two_way_defaults_to_stop() {
        assert_eq!(job("").unwrap().conflict, None);
        let two_way = job("two_way: true\n").unwrap();
        assert_eq!(two_way.conflict, Some(ConflictPolicy::Stop));
        assert_eq!(two_way.schema_changes, SchemaChanges::Stop, "a pair carries DDL one way, by the job that says");
        let carried = job("two_way: true\nschema_changes: carry\nconflict: source_wins\n").unwrap();
        assert_eq!(
            (carried.schema_changes, carried.conflict),
            (SchemaChanges::Carry, Some(ConflictPolicy::SourceWins))
        );
        for text in ["conflict: {newer_wins: updated_at}\n", "conflict: \"newer_wins: updated_at\"\n"] {
            assert_eq!(job(text).unwrap().conflict, Some(ConflictPolicy::NewerWins("updated_at".into())), "{text}");
        }
        let errors = job("conflict: latest\n").unwrap_err();
        assert!(errors[0]
            .to_string()
            .contains("expected source_wins, target_wins, stop or {newer_wins: COLUMN}, found `latest`"));
        let errors = job("conflict: {newest: x}\n").unwrap_err();
        assert!(errors[0].to_string().contains("conflict"), "{}", errors[0]);
        let errors = parse_job(
            "name: copy\nmode: snapshot\ntwo_way: true\nsource: {type: mysql, url: \"mysql://a\"}\ntarget: {type: mysql, url: \"mysql://b\"}\n",
            false,
            |_| None,
        )
        .unwrap_err();
        assert!(errors[0].to_string().contains("`two_way` is for cdc and snapshot+cdc jobs"), "{}", errors[0]);
    }
}
