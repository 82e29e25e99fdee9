//! The mappings of a run: the job's routes and transform rules, each source table's compiled
//! mapping to its target table, and which target tables several source tables are merged into.
//!
//! A cache, part of the run context: it compiles a mapping the first time a schema is met and
//! keeps it; it does not plan, write or decide anything else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::lock;
use crate::connector::Sink;
use crate::error::Result;
use crate::schema::{TableName, TableSchema};
use crate::spec::JobSpec;
use crate::transform::{TableMapping, Transforms};

/// The job's transform rules and the mappings compiled from them so far.
pub(super) struct Mappings {
    /// The job's routes and transform rules.
    transforms: Transforms,
    /// Behind a mutex: the copy's concurrent tasks and the stream compile and read mappings at
    /// the same time.
    known: Mutex<KnownMappings>,
}

#[derive(Default)]
struct KnownMappings {
    /// Each planned (or streamed) source table's mapping to its target table.
    by_source: BTreeMap<TableName, Arc<TableMapping>>,
    /// Target tables that more than one source table is merged into.
    shared_targets: BTreeSet<TableName>,
    /// Target tables that keep their own columns whatever the source's become
    /// (`schema_changes: ignore`): their names there.
    kept_columns: BTreeMap<TableName, Vec<String>>,
}

impl Mappings {
    pub(super) fn of(job: &JobSpec) -> Mappings {
        Mappings { transforms: Transforms::of(job), known: Mutex::new(KnownMappings::default()) }
    }

    /// The mapping of a source table as planned, or, for a schema the plan does not have (a
    /// table created or altered in the change stream), compiled now.
    pub(super) fn mapping(&self, table: &Arc<TableSchema>, sink: &dyn Sink) -> Result<Arc<TableMapping>> {
        let kept = {
            let known = lock(&self.known);
            if let Some(mapping) = known.by_source.get(&table.name) {
                // A table whose log now carries whole old rows, or no longer does, is mapped
                // again: the target schema says so to the writers (`TableDetails`).
                if mapping.source.columns == table.columns
                    && mapping.source.primary_key == table.primary_key
                    && mapping.source.details.old_values_unknown == table.details.old_values_unknown
                {
                    return Ok(mapping.clone());
                }
            }
            known.kept_columns.get(&self.target_name(&table.name, sink)).cloned()
        };
        let mapping = Arc::new(self.transforms.map_onto(table, &|name| sink.target_name(name), kept.as_deref())?);
        let mut known = lock(&self.known);
        // A table merged with others (created later, or altered) must keep their shape.
        let sibling = known
            .by_source
            .values()
            .find(|other| other.source.name != table.name && other.target.name == mapping.target.name)
            .cloned();
        if let Some(sibling) = sibling {
            self.transforms.check_merge(&sibling, &mapping)?;
            known.shared_targets.insert(mapping.target.name.clone());
        }
        known.by_source.insert(table.name.clone(), mapping.clone());
        Ok(mapping)
    }

    /// Maps the rows of every source table routed to `target` onto these columns of it (its
    /// names there), whatever columns the source's rows have (`schema_changes: ignore`).
    pub(super) fn keep_columns(&self, target: TableName, columns: Vec<String>) {
        let mut known = lock(&self.known);
        known.by_source.retain(|_, mapping| mapping.target.name != target);
        known.kept_columns.insert(target, columns);
    }

    /// The target name of a source table: routed, then named by the sink.
    pub(super) fn target_name(&self, source: &TableName, sink: &dyn Sink) -> TableName {
        self.transforms.target_name(source, &|name| sink.target_name(name))
    }

    /// Whether both source table names fall under the same route and transform rules.
    pub(super) fn same_rules(&self, one: &TableName, other: &TableName) -> bool {
        self.transforms.same_rules(one, other)
    }

    /// Takes in the target tables several source tables of the plan are merged into
    /// (`planner::merged_targets`).
    pub(super) fn add_merged_targets(&self, targets: BTreeSet<TableName>) {
        lock(&self.known).shared_targets.extend(targets);
    }

    /// Whether more than one source table is merged into target table `target` (every one is
    /// when the job is one of several sources: `JobSpec::fan_in`).
    pub(super) fn is_shared(&self, target: &TableName) -> bool {
        self.transforms.fans_in() || lock(&self.known).shared_targets.contains(target)
    }

    /// The mappings known so far whose target table is `target`.
    pub(super) fn merged_into(&self, target: &TableName) -> Vec<Arc<TableMapping>> {
        lock(&self.known).by_source.values().filter(|mapping| mapping.target.name == *target).cloned().collect()
    }
}
