//! The OpenAPI document served at `/api/v1/openapi.json`.

pub const DOCUMENT: &str = r##"{
  "openapi": "3.0.3",
  "info": { "title": "Sluice server API", "version": "1" },
  "servers": [{ "url": "/api/v1" }],
  "components": {
    "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
    "schemas": {
      "Error": { "type": "object", "properties": { "error": { "type": "string" }, "errors": { "type": "array", "items": { "type": "object", "properties": { "path": { "type": "string" }, "line": { "type": "integer", "nullable": true }, "message": { "type": "string" } } } } } },
      "JobDocument": { "type": "object", "description": "The job file of product.md, as JSON; send YAML with Content-Type: application/yaml" },
      "Created": { "type": "object", "properties": { "name": { "type": "string" }, "version": { "type": "integer" } } },
      "Job": { "type": "object", "properties": {
        "name": { "type": "string" }, "state": { "type": "string", "enum": ["pending", "running", "succeeded", "failed", "stopped"] },
        "phase": { "type": "string", "nullable": true, "enum": ["snapshotting", "catching_up", "streaming"] },
        "version": { "type": "integer" }, "mode": { "type": "string" }, "generation": { "type": "integer" },
        "stats": { "type": "object", "properties": { "rows_read": { "type": "integer" }, "rows_written": { "type": "integer" }, "rows_skipped": { "type": "integer" }, "rows_per_sec": { "type": "number" }, "lag_secs": { "type": "integer", "nullable": true } } },
        "tasks": { "type": "array", "items": { "type": "object", "properties": {
          "id": { "type": "string" }, "kind": { "type": "string", "enum": ["snapshot", "cdc"] }, "state": { "type": "string" },
          "worker": { "type": "string", "nullable": true }, "epoch": { "type": "integer", "nullable": true }, "position": { "nullable": true },
          "lag_secs": { "type": "integer", "nullable": true }, "rows_written": { "type": "integer" },
          "error": { "type": "object", "nullable": true, "properties": { "side": { "type": "string", "enum": ["source", "target", "state"] }, "message": { "type": "string" } } } } } } } }
    }
  },
  "security": [{ "bearer": [] }],
  "paths": {
    "/jobs": {
      "get": { "summary": "List jobs (name, state, version, mode)", "responses": { "200": { "description": "jobs" } } },
      "post": { "summary": "Create a job from its document; every validation error is returned", "requestBody": { "content": { "application/json": { "schema": { "$ref": "#/components/schemas/JobDocument" } }, "application/yaml": {} } },
        "responses": { "201": { "description": "created", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Created" } } } }, "400": { "description": "invalid", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }, "409": { "description": "exists" } } }
    },
    "/jobs/{name}": {
      "get": { "summary": "A job: state, phase, stats, tasks with worker, position, lag, counters, last error", "responses": { "200": { "description": "job", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Job" } } } }, "404": { "description": "no such job" } } },
      "put": { "summary": "A new version of the job (N+1); it is replanned and resumes from its checkpoints", "responses": { "200": { "description": "new version" }, "400": { "description": "invalid" } } },
      "delete": { "summary": "Delete the job, its versions, plan, statuses and runs", "responses": { "204": { "description": "deleted" } } }
    },
    "/jobs/{name}/stop": { "post": { "summary": "Stop the job's tasks (they keep their checkpoints)", "responses": { "200": { "description": "stopping" } } } },
    "/jobs/{name}/start": { "post": { "summary": "Start a stopped job; it resumes from its checkpoints", "responses": { "200": { "description": "starting" } } } },
    "/jobs/{name}/restart": { "post": { "summary": "Stop and start the job's tasks (a new generation)", "responses": { "200": { "description": "restarting" } } } },
    "/jobs/{name}/versions": { "get": { "summary": "The job's versions", "responses": { "200": { "description": "versions" } } } },
    "/jobs/{name}/versions/{version}": { "get": { "summary": "One version's document, secrets redacted", "responses": { "200": { "description": "version" } } } },
    "/jobs/{name}/versions/{a}/diff/{b}": { "get": { "summary": "A line diff of two versions' documents", "responses": { "200": { "description": "diff" } } } },
    "/jobs/{name}/rollback": { "post": { "summary": "Make version N the current one again, as a new version", "requestBody": { "content": { "application/json": { "schema": { "type": "object", "properties": { "version": { "type": "integer" } } } } } }, "responses": { "200": { "description": "new version" }, "404": { "description": "no such version" } } } },
    "/jobs/{name}/runs": { "get": { "summary": "Run summaries of the job's finished task runs", "responses": { "200": { "description": "runs" } } } },
    "/jobs/{name}/tables": { "post": { "summary": "Add tables to a running job with a change stream: a new version; they are copied while the stream runs on, then join it (job field backfill until then)", "requestBody": { "content": { "application/json": { "schema": { "type": "object", "properties": { "tables": { "type": "array", "items": { "type": "string" } } } } } } }, "responses": { "202": { "description": "accepted" }, "400": { "description": "invalid, a snapshot job, or a table already in the job" }, "409": { "description": "tables added before are still being copied" } } } },
    "/workers": { "get": { "summary": "Live workers: id, address, capacity, tasks, alive", "responses": { "200": { "description": "workers" } } } },
    "/leader": { "get": { "summary": "The leader's worker id", "responses": { "200": { "description": "leader" } } } }
  }
}"##;

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_is_json() {
        let document: serde_json::Value = serde_json::from_str(super::DOCUMENT).expect("valid JSON");
        assert!(document["paths"]["/jobs/{name}/rollback"].is_object());
    }
}
