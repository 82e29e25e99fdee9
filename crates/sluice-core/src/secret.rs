//! Secrets: a type that never prints its content, URL redaction, and a process-wide scrubber
//! that removes every registered secret from text on its way to logs, errors and summaries.

use std::fmt;
use std::sync::{Mutex, OnceLock};

const REDACTED: &str = "***";

/// A secret string. `Debug` and `Display` print `***`; only `expose` reveals it, at the one
/// place that hands it to a driver.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret and registers it with the scrubber.
    pub fn new(value: impl Into<String>) -> Secret {
        let value = value.into();
        register(&value);
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(REDACTED)
    }
}

fn registry() -> &'static Mutex<Vec<String>> {
    static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Remembers a secret so `scrub` removes it from any text. Very short values are not registered:
/// scrubbing a one-letter password would mangle every message.
pub fn register(secret: &str) {
    if secret.len() < 3 {
        return;
    }
    let mut secrets = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !secrets.iter().any(|known| known == secret) {
        secrets.push(secret.to_owned());
        // Longest first, so a secret containing another is removed whole.
        secrets.sort_by_key(|known| std::cmp::Reverse(known.len()));
    }
}

/// Replaces every registered secret, and any password inside a URL, with `***`.
pub fn scrub(text: &str) -> String {
    let mut text = redact_url_passwords(text);
    let secrets = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for secret in secrets.iter() {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), REDACTED);
        }
    }
    text
}

/// Redacts the password of every `scheme://user:password@host` found in the text.
pub fn redact_url_passwords(text: &str) -> String {
    let mut output = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        output.push_str(before);
        let authority_end = after.find(['/', ' ', '"', '\'', '\n', '?', '#']).unwrap_or(after.len());
        let authority = &after[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at_sign), Some(colon)) if colon < at_sign => {
                output.push_str(&authority[..=colon]);
                output.push_str(REDACTED);
                output.push_str(&authority[at_sign..]);
            }
            _ => output.push_str(authority),
        }
        rest = &after[authority_end..];
    }
    output.push_str(rest);
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("CANARY-unit-4b1d");
        assert_eq!(format!("{secret} {secret:?}"), "*** ***");
        assert_eq!(scrub("login with CANARY-unit-4b1d failed"), "login with *** failed");
    }

    #[test]
    fn url_passwords_are_redacted_wherever_they_appear() {
        assert_eq!(
            redact_url_passwords("cannot reach mysql://repl:p@ss:w0rd@db:3306/x and postgres://u@h/db"),
            "cannot reach mysql://repl:***@db:3306/x and postgres://u@h/db"
        );
        assert_eq!(redact_url_passwords("no url here"), "no url here");
    }
}
