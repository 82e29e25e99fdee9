//! The web console: three static files embedded in the binary (plain HTML, CSS and JavaScript,
//! no build step, nothing fetched at run time), served without a token. The page asks for a
//! token at its login and calls the API with it; the token stays in the browser's session
//! storage, never in a URL.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// What every console response carries: no caching across versions, no framing by other sites,
/// scripts and styles from this server only.
const HEADERS: [(header::HeaderName, &str); 4] = [
    (header::CACHE_CONTROL, "no-cache"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
];

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    let [a, b, c, d] = HEADERS;
    ([(header::CONTENT_TYPE, content_type), a, b, c, d], body)
}

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}
