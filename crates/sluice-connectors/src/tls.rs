//! TLS for every connection Sluice makes or accepts: rustls with the ring provider, certificate
//! files in PEM, and the three strengths of server verification that libpq and the MySQL client
//! name (`require`, `verify-ca`, `verify-full` / `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`).
//!
//! Connectors parse their own URL options into [`ClientTls`]; this module turns them into a
//! rustls configuration. Every failure names the file or setting at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// The crypto provider of every TLS configuration in the process. It is also installed as the
/// process default, for the drivers that build their own rustls configuration.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            // Err only when a default is installed already, which is then the one used.
            let _ = CryptoProvider::install_default((*provider).clone());
            provider
        })
        .clone()
}

/// How much of the server's certificate a client checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// Encrypt, check nothing (libpq `require` without a root certificate, MySQL `REQUIRED`).
    Encrypt,
    /// The chain must lead to a trusted root; any host name (`verify-ca`, `VERIFY_CA`).
    Chain,
    /// The chain and the host name (`verify-full`, `VERIFY_IDENTITY`).
    Full,
}

/// A client's TLS settings: verification strength, the roots to trust (the system's when none),
/// and an optional client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub verification: Verification,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// The rustls configuration for these settings; `Err` names the file or setting at fault.
    pub fn config(&self) -> Result<ClientConfig, String> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS: {error}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.verification {
            Verification::Encrypt => Arc::new(Lenient::AnyCertificate(provider())),
            Verification::Chain => Arc::new(Lenient::AnyName(self.webpki()?)),
            Verification::Full => self.webpki()?,
        };
        let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|error| format!("TLS client certificate {}: {error}", cert.display())),
            (None, None) => Ok(builder.with_no_client_auth()),
            _ => Err("a TLS client certificate needs both its certificate and its key file".to_owned()),
        }
    }

    fn webpki(&self) -> Result<Arc<dyn ServerCertVerifier>, String> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for certificate in certificates(ca)? {
                    roots.add(certificate).map_err(|error| {
                        format!("TLS CA file {}: not a usable CA certificate: {error}", ca.display())
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for certificate in found.certs {
                    let _ = roots.add(certificate);
                }
                if roots.is_empty() {
                    return Err("TLS verification needs a CA certificate: none is given and the system has none; \
                                give the CA file"
                        .to_owned());
                }
            }
        }
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|error| format!("TLS: {error}"))?;
        Ok(verifier)
    }
}

/// A server's TLS configuration from a certificate chain and its key (PEM files).
pub fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, String> {
    ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS: {error}"))?
        .with_no_client_auth()
        .with_single_cert(certificates(cert)?, private_key(key)?)
        .map_err(|error| format!("TLS certificate {} with key {}: {error}", cert.display(), key.display()))
}

/// The certificates of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let read = std::fs::read(path).map_err(|error| format!("cannot read the TLS file {}: {error}", path.display()))?;
    let certificates = CertificateDer::pem_slice_iter(&read)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("TLS file {}: not PEM certificates: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("TLS file {}: holds no certificate (expected PEM)", path.display()));
    }
    Ok(certificates)
}

/// The private key of a PEM file.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let read = std::fs::read(path).map_err(|error| format!("cannot read the TLS key {}: {error}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&read)
        .map_err(|error| format!("TLS key {}: not a PEM private key: {error}", path.display()))
}

/// The server name to check a certificate against: a DNS name or an IP address.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|_| format!("{host:?} is not a host name TLS can check"))
}

/// What to do when a TLS handshake fails; `{mode}` and `{ca}` are the connector's names for
/// the mode and CA settings.
pub const HANDSHAKE_HINT: &str = "the TLS handshake failed: check that {ca} is the CA that signed the server's \
     certificate, that the host in the URL is a name the certificate holds, or weaken {mode}";

/// Whether an error text is a refused certificate (ours or the server's) or a server that does
/// not speak TLS where TLS is required: settings to fix, not moments to wait out. (A handshake
/// cut short by a restarting server is neither.)
pub fn is_certificate_failure(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    ["certificate", "unknownissuer", "notvalidforname", "does not support tls", "does not offer tls", "no tls"]
        .iter()
        .any(|words| text.contains(words))
}

/// Says in words why a TLS handshake failed (rustls' messages are terse).
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A verifier that asks less than the default one.
#[derive(Debug)]
enum Lenient {
    /// Accepts any certificate, but still checks that the server holds its key.
    AnyCertificate(Arc<CryptoProvider>),
    /// Checks the chain, not the name.
    AnyName(Arc<dyn ServerCertVerifier>),
}

impl Lenient {
    /// Checks a handshake's signature (TLS 1.2 or 1.3) as the default verifier does.
    fn signature(
        &self,
        tls13: bool,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match (self, tls13) {
            (Lenient::AnyCertificate(provider), false) => rustls::crypto::verify_tls12_signature(
                message,
                certificate,
                signature,
                &provider.signature_verification_algorithms,
            ),
            (Lenient::AnyCertificate(provider), true) => rustls::crypto::verify_tls13_signature(
                message,
                certificate,
                signature,
                &provider.signature_verification_algorithms,
            ),
            (Lenient::AnyName(webpki), false) => webpki.verify_tls12_signature(message, certificate, signature),
            (Lenient::AnyName(webpki), true) => webpki.verify_tls13_signature(message, certificate, signature),
        }
    }
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Lenient::AnyName(webpki) = self else { return Ok(ServerCertVerified::assertion()) };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature(false, message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature(true, message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        match self {
            Lenient::AnyCertificate(provider) => provider.signature_verification_algorithms.supported_schemes(),
            Lenient::AnyName(webpki) => webpki.supported_verify_schemes(),
        }
    }
}

/// How a connector names its TLS URL parameters, and the modes it knows.
#[derive(Debug)]
pub struct TlsParameters {
    pub mode: &'static str,
    /// The modes, matched without regard to case for MySQL's upper-case names.
    pub modes: &'static [&'static str],
    pub ca: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

/// The TLS settings of a URL, and the URL without them (for the driver).
#[derive(Debug)]
pub struct FoundTls {
    pub rest: String,
    pub mode: Option<String>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl FoundTls {
    /// The client settings for a verification strength, with the files found.
    pub fn client(&self, verification: Verification) -> ClientTls {
        ClientTls { verification, ca: self.ca.clone(), cert: self.cert.clone(), key: self.key.clone() }
    }
}

impl TlsParameters {
    pub fn names(&self) -> [&'static str; 4] {
        [self.mode, self.ca, self.cert, self.key]
    }

    /// Takes this connector's TLS parameters out of `url` (the last of a repeated one wins).
    pub fn read(&self, url: &str) -> FoundTls {
        let (rest, taken) = take_parameters(url, &self.names());
        let value = |name: &str| taken.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.clone());
        let path = |name: &str| value(name).filter(|path| !path.is_empty()).map(PathBuf::from);
        FoundTls { rest, mode: value(self.mode), ca: path(self.ca), cert: path(self.cert), key: path(self.key) }
    }

    /// Every problem with the TLS parameters of `url`, for the job file's validation.
    pub fn problems(&self, url: &str) -> Vec<String> {
        let (_, taken) = take_parameters(url, &self.names());
        let value = |name: &str| taken.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.as_str());
        let mut problems = Vec::new();
        if let Some(mode) = value(self.mode) {
            if !self.modes.iter().any(|known| known.eq_ignore_ascii_case(mode)) {
                problems.push(format!("{}={mode} is not one of {}", self.mode, self.modes.join(", ")));
            }
        }
        if value(self.cert).is_some() != value(self.key).is_some() {
            problems.push(format!("{} and {} go together: a client certificate needs its key", self.cert, self.key));
        }
        for name in [self.ca, self.cert, self.key] {
            if value(name).is_some_and(str::is_empty) {
                problems.push(format!("{name} is empty; give the path of a PEM file"));
            }
        }
        problems
    }
}

/// Removes the query parameters named in `names` from a URL (`scheme://…?a=1&b=2`) or a
/// key=value connection string (`host=h sslmode=require`), returning the rest and the removed
/// `(name, value)` pairs in order. Values are percent-decoded in URLs.
pub fn take_parameters(connection: &str, names: &[&str]) -> (String, Vec<(String, String)>) {
    let mut taken = Vec::new();
    if connection.contains("://") {
        let Some((base, query)) = connection.split_once('?') else { return (connection.to_owned(), taken) };
        let (query, fragment) =
            query.split_once('#').map_or((query, None), |(query, fragment)| (query, Some(fragment)));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if names.contains(&name) {
                taken.push((name.to_owned(), percent_decode(value)));
            } else {
                kept.push(pair);
            }
        }
        let mut rest = base.to_owned();
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            rest.push('#');
            rest.push_str(fragment);
        }
        (rest, taken)
    } else {
        let mut kept = Vec::new();
        for (name, value) in conninfo_pairs(connection) {
            if names.contains(&name.as_str()) {
                taken.push((name, value));
            } else {
                kept.push(format!("{name}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")));
            }
        }
        (kept.join(" "), taken)
    }
}

/// The `key = value` pairs of a libpq connection string: values may be single-quoted, with
/// `\'` and `\\` escapes; spaces around `=` are allowed.
fn conninfo_pairs(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut characters = text.chars().peekable();
    loop {
        while characters.next_if(|character| character.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(character) = characters.next_if(|character| *character != '=' && !character.is_whitespace()) {
            key.push(character);
        }
        if key.is_empty() {
            break;
        }
        while characters.next_if(|character| character.is_whitespace()).is_some() {}
        if characters.next_if_eq(&'=').is_none() {
            pairs.push((key, String::new()));
            continue;
        }
        while characters.next_if(|character| character.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = characters.next_if_eq(&'\'').is_some();
        while let Some(character) = characters.next() {
            match character {
                '\\' => value.extend(characters.next()),
                '\'' if quoted => break,
                character if character.is_whitespace() && !quoted => break,
                character => value.push(character),
            }
        }
        pairs.push((key, value));
    }
    pairs
}

pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|byte| (*byte as char).to_digit(16));
        match (bytes[index], hex(index + 1), hex(index + 2)) {
            (b'%', Some(high), Some(low)) => {
                decoded.push((high * 16 + low) as u8);
                index += 3;
            }
            (byte, _, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_urls_and_key_value_strings() {
        let (rest, taken) = take_parameters(
            "postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
            &["sslmode", "sslrootcert"],
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(
            taken,
            [("sslmode".to_owned(), "verify-full".to_owned()), ("sslrootcert".to_owned(), "/tmp/ca.pem".to_owned())]
        );
        let (rest, taken) = take_parameters("host=h user=u sslmode = require", &["sslmode"]);
        assert_eq!(rest, "host='h' user='u'");
        assert_eq!(taken, [("sslmode".to_owned(), "require".to_owned())]);
        // A quoted value is one value, whatever it holds.
        let (rest, taken) = take_parameters(r"password='a sslmode=disable\'x' sslmode=verify-full", &["sslmode"]);
        assert_eq!(taken, [("sslmode".to_owned(), "verify-full".to_owned())]);
        assert_eq!(rest, r"password='a sslmode=disable\'x'");
        assert_eq!(take_parameters("postgres://h/db?sslrootcert=%2Fa+b.pem", &["sslrootcert"]).1[0].1, "/a+b.pem");
        assert_eq!(take_parameters("mysql://u@h:1", &["ssl-mode"]).0, "mysql://u@h:1");
    }
}
