//! The names the engine gives to what it writes, that a target must know to store and find it
//! again: the change stream's task, a split's task, a hidden copy's table.

use crate::schema::TableName;

/// The task id of the change stream: its checkpoint row in the target carries it.
pub const STREAM_TASK: &str = "stream";

/// The prefix of a hidden copy's name (`crate::hidden`).
pub const HIDDEN_PREFIX: &str = "_sluice_copy_";

/// The task id of a table's split number `index`: `namespace.table#index`.
pub fn split_task(table: &TableName, index: impl std::fmt::Display) -> String {
    format!("{table}#{index}")
}

/// What follows the last `#` of a split's task id (its number, or `keys`), the whole id when it
/// has none.
pub fn split_index(task: &str) -> &str {
    task.rsplit_once('#').map_or(task, |(_, index)| index)
}

/// The name a table's copy has until it is published: in the same namespace (so publishing is a
/// rename, and needs no right beyond the table's own), its own name with a prefix.
pub(crate) fn hidden_name(table: &TableName) -> TableName {
    TableName { namespace: table.namespace.clone(), name: format!("{HIDDEN_PREFIX}{}", table.name) }
}

/// A table's own name, given the name it is written under (hidden or not): what a target names
/// its key, sequences and indexes after, so they need no rename when the table is published.
pub fn own_name(name: &str) -> &str {
    name.strip_prefix(HIDDEN_PREFIX).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_task_names_its_table_and_index_and_a_hidden_name_gives_its_own_back() {
        let table = TableName { namespace: Some("shop".into()), name: "orders".into() };
        let task = split_task(&table, 7);
        assert_eq!(task, "shop.orders#7");
        assert_eq!(split_index(&task), "7");
        assert_eq!(split_index(STREAM_TASK), STREAM_TASK);
        assert_eq!(own_name(&hidden_name(&table).name), "orders");
        assert_eq!(own_name("orders"), "orders");
    }
}
