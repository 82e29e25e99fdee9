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

/// A secret at least this long is removed wherever it appears; a shorter one only where it
/// stands alone (not inside a longer word), so a password `test` does not turn a table
/// `contest_entries` into `con***_entries`.
const ANYWHERE_LENGTH: usize = 8;

/// The backstop behind structural redaction: replaces every registered secret, and any
/// password inside a URL or a `password=` pair, with `***`. Messages are built from redacted
/// forms in the first place (`Secret`, `redact_url_passwords`); this catches what a driver
/// may echo.
pub fn scrub(text: &str) -> String {
    let mut text = redact_url_passwords(text);
    let secrets = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for secret in secrets.iter() {
        if text.contains(secret.as_str()) {
            text = replace_secret(&text, secret);
        }
    }
    text
}

/// Replaces the occurrences of `secret` in `text` (whole words only, for short secrets).
fn replace_secret(text: &str, secret: &str) -> String {
    if secret.len() >= ANYWHERE_LENGTH {
        return text.replace(secret, REDACTED);
    }
    let word =
        |character: Option<char>| character.is_some_and(|character| character.is_alphanumeric() || character == '_');
    let mut output = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(secret) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + secret.len()..].chars().next();
        output.push_str(&rest[..at]);
        if word(before) || word(after) {
            output.push_str(secret);
        } else {
            output.push_str(REDACTED);
        }
        rest = &rest[at + secret.len()..];
    }
    output.push_str(rest);
    output
}

/// Redacts the password of every `scheme://user:password@host` found in the text, and the
/// value of every `password=` (URL query parameter or key=value connection string).
pub fn redact_url_passwords(text: &str) -> String {
    redact_password_pairs(&redact_url_authorities(text))
}

/// Redacts the value after each `password=` / `pwd=` / `passwd=` (any case), up to the next
/// `&`, whitespace, quote or the end.
fn redact_password_pairs(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut output = String::with_capacity(text.len());
    let mut position = 0;
    while let Some(found) = ["password=", "passwd=", "pwd="]
        .iter()
        .filter_map(|key| lower[position..].find(key).map(|at| (position + at, key.len())))
        .min()
    {
        let (at, key_length) = found;
        let starts_word =
            at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric() && lower.as_bytes()[at - 1] != b'_';
        let value_start = at + key_length;
        output.push_str(&text[position..value_start]);
        position = value_start;
        if !starts_word {
            continue;
        }
        let quoted = text[value_start..].starts_with('\'');
        let value_end = if quoted {
            text[value_start + 1..].find('\'').map_or(text.len(), |end| value_start + 1 + end + 1)
        } else {
            text[value_start..]
                .find(|character: char| {
                    character == '&' || character == '#' || character == '"' || character.is_whitespace()
                })
                .map_or(text.len(), |end| value_start + end)
        };
        if value_end > value_start {
            output.push_str(REDACTED);
        }
        position = value_end;
    }
    output.push_str(&text[position..]);
    output
}

/// Redacts the password of every `scheme://user:password@host` found in the text.
fn redact_url_authorities(text: &str) -> String {
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
            (Some(at_sign), _) if token_scheme(&before[..before.len() - 3]) => {
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

/// URL schemes whose user part alone is a secret (a NATS token: `nats://TOKEN@host`).
const TOKEN_SCHEMES: &[&str] = &["nats", "tls", "ws", "wss"];

/// Whether the text before `://` ends with a scheme whose user part alone is a token.
fn token_scheme(before: &str) -> bool {
    let scheme = before.rsplit(|character: char| !(character.is_ascii_alphanumeric() || "+-.".contains(character)));
    scheme.take(1).any(|scheme| TOKEN_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// The passwords a connection URL or key=value string holds, as written: the one in
/// `user:password@` (or the whole user part of a NATS URL, a token), and every `password=` (or
/// `passwd=`, `pwd=`) value, quotes removed.
pub(crate) fn url_passwords(connection: &str) -> Vec<&str> {
    let mut passwords = Vec::new();
    if let Some((scheme, after_scheme)) = connection.split_once("://") {
        let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
        if let Some((credentials, _)) = authority.rsplit_once('@') {
            match credentials.split_once(':') {
                Some((_, password)) => passwords.push(password),
                None if token_scheme(scheme) => passwords.push(credentials),
                None => {}
            }
        }
    }
    passwords.extend(
        connection
            .split(|character: char| character == '?' || character == '&' || character.is_whitespace())
            .filter_map(|pair| pair.split_once('='))
            .filter(|(key, _)| matches!(key.to_ascii_lowercase().as_str(), "password" | "passwd" | "pwd"))
            .map(|(_, value)| value.trim_matches('\'')),
    );
    passwords.retain(|password| !password.is_empty());
    passwords
}

/// Whether a connection URL or key=value string, as written (before `${VAR}` expansion), holds
/// a password in plain text: one that is not a `${VAR}` reference.
pub fn has_literal_password(written: &str) -> bool {
    url_passwords(written).iter().any(|password| !password.contains("${"))
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
        assert_eq!(
            redact_url_passwords("mysql://h:1/db?user=u&password=p%40ss&x=1 and host=h password='a b' port=5"),
            "mysql://h:1/db?user=u&password=***&x=1 and host=h password=*** port=5"
        );
        assert_eq!(redact_url_passwords("new_password=x; mypwd=y"), "new_password=x; mypwd=y");
        // A NATS URL's user part alone is a token; another scheme's is a user name.
        assert_eq!(
            redact_url_passwords("connect nats://s3cr3tT0ken@127.0.0.1:4222, tls://a:b@h, mysql://u@h"),
            "connect nats://***@127.0.0.1:4222, tls://a:***@h, mysql://u@h"
        );
        assert_eq!(url_passwords("NATS://tok3n@h:4222"), ["tok3n"]);
    }

    #[test]
    fn literal_passwords_are_told_from_variables() {
        assert!(has_literal_password("mysql://u:pw@h:1"));
        assert!(has_literal_password("postgres://u@h/db?sslmode=require&password=pw"));
        assert!(has_literal_password("host=h password=pw"));
        assert!(!has_literal_password("mysql://u:${PW}@h:1"));
        assert!(!has_literal_password("mysql://u@h:1?password=${PW}"));
        assert!(!has_literal_password("mysql://u@h:1"));
        assert!(has_literal_password("nats://t0ken@h:4222"));
        assert!(!has_literal_password("nats://${NATS_TOKEN}@h:4222"));
        assert!(!has_literal_password("${SOURCE_URL}"));
    }

    #[test]
    fn a_short_secret_is_scrubbed_only_where_it_stands_alone() {
        register("tst");
        assert_eq!(scrub("table contst_entries, password tst."), "table contst_entries, password ***.");
        register("LongerSecret99");
        assert_eq!(scrub("xLongerSecret99y"), "x***y");
    }
}
