//! The job file: parsed from YAML or JSON into nodes that remember their lines, then decoded into
//! a typed `JobSpec` while every error is collected.

mod alarm;
mod conflict;
mod cursor;
mod decode;
mod document;
mod job;
mod placement;
mod schedule;
pub(crate) mod sql_text;
mod transform;

pub use alarm::{decode_alarms, written_out_targets, AlarmMetric, AlarmSpec, Condition, Notify, Operator};
pub use conflict::ConflictPolicy;
pub use cursor::CursorSpec;
pub use decode::{is_placeholder, is_variable_name, join, unset_variable, Decoder, Fields, SpecError, Variables};
pub use document::{parse_json, parse_yaml, to_json, Node, NodeKind};
pub use job::{
    parse_job, parse_job_partially, parse_job_with, Consistency, EndpointSpec, ErrorPolicy, JobSpec, Limits, Mode,
    NamedEndpoint, RestartPolicy, RetryPolicy, SchemaChanges, VerifySpec, WriteMode, ZeroDates,
};
pub use placement::{is_placement_word, Placement};
pub use schedule::{Dependency, Missed, OnFailure, Overlap, ScheduleSpec};
pub use transform::{EventKinds, MaskRule, MaskSpec, RouteSpec, TransformSpec};
