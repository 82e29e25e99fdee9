//! The OpenAPI document served at `/api/v1/openapi.json`, derived from the handlers'
//! annotations and the view types (utoipa), so it describes exactly what the API answers.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use super::views::*;

#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice server API", version = "1", description = "Jobs, their versions and lifecycle, their series and dirty records, alarms, the cluster's workers and leader. Every route needs a bearer token when the server has tokens: read looks, operate also runs jobs, admin changes them; every change is in the audit trail."),
    servers((url = "/api/v1")),
    paths(
        super::list_jobs,
        super::create_job,
        super::show_job,
        super::update_job,
        super::delete_job,
        super::stop_job,
        super::start_job,
        super::restart_job,
        super::run_batch,
        super::list_versions,
        super::show_version,
        super::diff_versions,
        super::rollback_job,
        super::list_runs,
        super::add_tables,
        super::resync_tables,
        super::list_workers,
        super::show_leader,
        super::job_series,
        super::list_dirty,
        super::discard_dirty,
        super::replay_dirty,
        super::verify_job,
        super::last_verification,
        super::list_repairs,
        super::show_alarms,
        super::set_alarms,
        super::audit::list,
        super::audit::whoami,
    ),
    components(schemas(
        JobView, JobState, ScheduleView, BatchView, BatchQueued, BatchRangeView, BatchRowsView, JobStatsView, TaskView, ErrorView, JobSummary, VersionCreated, DesiredView, VersionSummary,
        VersionDocument, VersionDiff, TablesAdded, super::views::ResyncAccepted, WorkerView, LeaderView, ErrorBody, FieldError,
        super::series::SeriesView, super::series::Point, super::audit::AuditRecord, super::auth::Caller,
        super::auth::Role
    )),
    modifiers(&Bearer),
    security(("bearer" = [])),
)]
struct Document;

/// The bearer-token scheme every route uses.
struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON.
pub fn document() -> String {
    Document::openapi().to_json().expect("the OpenAPI document serializes")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_describes_every_route_with_its_types() {
        let document: serde_json::Value = serde_json::from_str(&super::document()).expect("valid JSON");
        let paths = document["paths"].as_object().expect("paths");
        for path in [
            "/jobs",
            "/jobs/{name}",
            "/jobs/{name}/stop",
            "/jobs/{name}/start",
            "/jobs/{name}/restart",
            "/jobs/{name}/versions",
            "/jobs/{name}/versions/{version}",
            "/jobs/{name}/versions/{a}/diff/{b}",
            "/jobs/{name}/rollback",
            "/jobs/{name}/runs",
            "/jobs/{name}/tables",
            "/jobs/{name}/resync",
            "/jobs/{name}/batches",
            "/jobs/{name}/series",
            "/jobs/{name}/dirty",
            "/jobs/{name}/dirty/discard",
            "/jobs/{name}/dirty/replay",
            "/jobs/{name}/verify",
            "/jobs/{name}/repairs",
            "/alarms",
            "/workers",
            "/leader",
        ] {
            assert!(paths.contains_key(path), "{path} is not in the document");
        }
        assert_eq!(paths.len(), 24, "{:?}", paths.keys().collect::<Vec<_>>());
        let job = &document["components"]["schemas"]["JobView"]["properties"];
        assert!(job["tasks"].is_object() && job["state"].is_object() && job["stats"].is_object(), "{job}");
        assert!(job["schedule"].is_object(), "{job}");
        let history = &document["components"]["schemas"]["ScheduleView"]["properties"]["history"];
        assert!(history.is_object(), "{history}");
        let states = &document["components"]["schemas"]["JobState"]["enum"];
        assert_eq!(
            states,
            &serde_json::json!(["scheduled", "pending", "running", "restarting", "succeeded", "failed", "stopped"])
        );
        assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        let created = &document["paths"]["/jobs"]["post"]["responses"]["201"]["content"]["application/json"]["schema"];
        assert_eq!(created["$ref"], "#/components/schemas/VersionCreated");
    }
}
