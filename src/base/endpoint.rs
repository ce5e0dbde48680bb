//! Node URLs: checked before fred sees them, so that every mistake gets a message that says what
//! to do, and shown only in redacted form, so that no password reaches a message, `Debug` or log.
//!
//! Owns: the list of accepted schemes, URL validation, structural redaction.
//! Must not: talk to Redis, or know anything about locks (it sits at the bottom, beside `error`).

use crate::base::error::InvalidInput;

/// Schemes fred understands, as `(scheme, needs TLS)`.
const SCHEMES: &[(&str, bool)] = &[
    ("redis", false),
    ("valkey", false),
    ("redis-cluster", false),
    ("valkey-cluster", false),
    ("redis-sentinel", false),
    ("valkey-sentinel", false),
    ("rediss", true),
    ("valkeys", true),
    ("rediss-cluster", true),
    ("valkeys-cluster", true),
    ("rediss-sentinel", true),
    ("valkeys-sentinel", true),
];

/// Schemes of a server on a Unix domain socket, whose URL path is the socket's path
/// (`redis+unix:///run/redis.sock`); `unix://` is read as `redis+unix://`.
const UNIX_SCHEMES: &[&str] = &["redis+unix", "valkey+unix", "unix"];

/// Whether this build can speak TLS (fredlock's `tls` feature).
pub(crate) const TLS: bool = cfg!(feature = "tls");

/// Whether this build can reach a server on a Unix socket (fredlock's `unix-sockets` feature).
pub(crate) const UNIX: bool = cfg!(feature = "unix-sockets");

/// `raw` as fred reads it: trimmed, and a `unix://` URL as `redis+unix://` (fred knows only
/// the `+unix` schemes).
pub(crate) fn normalized(raw: &str) -> String {
    let trimmed = raw.trim();
    match trimmed.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("unix") => {
            format!("redis+unix://{rest}")
        }
        _ => trimmed.to_string(),
    }
}

/// Checks `raw` as node `index`'s URL: not empty, a scheme fred accepts (TLS schemes only with
/// the `tls` feature: fred would otherwise connect WITHOUT encryption), and a URL that parses.
pub(crate) fn check(index: usize, raw: &str) -> Result<(), InvalidInput> {
    let invalid = |reason: String| InvalidInput::InvalidUrl {
        index,
        url: redact(raw),
        reason,
    };
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(invalid(
            "the URL is empty: give each node as redis://host:port".into(),
        ));
    }
    let Some((scheme, _)) = trimmed.split_once("://") else {
        return Err(invalid(
            "no scheme: add redis:// in front (for example redis://127.0.0.1:6379)".into(),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    if UNIX_SCHEMES.contains(&scheme.as_str()) {
        return unix_socket(&normalized(trimmed)).map_err(invalid);
    }
    match SCHEMES.iter().find(|(s, _)| *s == scheme) {
        None => {
            return Err(invalid(format!(
                "unsupported scheme {scheme}://: use redis://, rediss:// (TLS), redis-cluster://, \
                 redis-sentinel:// or redis+unix:// (valkey:// and valkeys:// work too)"
            )))
        }
        Some((_, true)) if !TLS => {
            return Err(invalid(format!(
                "{scheme}:// asks for TLS, but fredlock was built without its `tls` feature \
                 (the connection would not be encrypted): enable the feature, or use redis://"
            )))
        }
        Some(_) => {}
    }
    let url = match url::Url::parse(trimmed) {
        Ok(url) => url,
        // url's messages ("invalid port number", "empty host") never repeat the input.
        Err(e) => return Err(invalid(e.to_string())),
    };
    database(&url).map_err(invalid)
}

/// A Unix-socket URL (normalized): the feature is on, and the path names a socket.
fn unix_socket(url: &str) -> Result<(), String> {
    if !UNIX {
        return Err(
            "a Unix-socket node needs fredlock's `unix-sockets` feature: enable it, or \
             give the node as redis://host:port"
                .into(),
        );
    }
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    let path = parsed.path();
    if path.is_empty() || path == "/" || path.ends_with('/') {
        return Err(format!(
            "the path {path:?} names no socket: give the socket's absolute path, as in \
             redis+unix:///run/redis/redis.sock"
        ));
    }
    Ok(())
}

/// The path of a single server's or a sentinel's URL is its database number (fred reads it as
/// one, and says only "Invalid integer string." otherwise). A cluster's path is not read.
fn database(url: &url::Url) -> Result<(), String> {
    let clustered = url.scheme().ends_with("-cluster");
    let path = url.path();
    let number = path.strip_prefix('/').unwrap_or(path);
    if clustered || number.is_empty() || number.parse::<u8>().is_ok() {
        return Ok(());
    }
    Err(format!(
        "the path {path:?} is read as the database number: give a number from 0 to 255 (for \
         example redis://host:6379/0), or no path for database 0"
    ))
}

/// `raw` with the password (and any `*password*` query value) replaced by `***`, found by the
/// URL's structure (scheme, authority, user info), never by searching for the secret's text,
/// which could corrupt the rest of the message.
pub(crate) fn redact(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        // No scheme, so no structure to find the password by: show nothing if there may be one.
        return if raw.contains('@') {
            "<unparsable URL>".to_string()
        } else {
            raw.to_string()
        };
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.to_ascii_lowercase().contains("password") => {
                        format!("{k}=***")
                    }
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(raw: &str) -> String {
        match check(0, raw) {
            Err(InvalidInput::InvalidUrl { reason, url, .. }) => {
                assert!(!url.contains("hunter2"), "{url}");
                reason
            }
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn clean_messages_for_common_mistakes() {
        assert!(reason("").contains("empty"));
        assert!(reason("   ").contains("empty"));
        assert!(reason("127.0.0.1:6379").contains("add redis://"));
        assert!(reason("http://127.0.0.1:6379").contains("unsupported scheme http://"));
        assert!(reason("redis://u:hunter2@127.0.0.1:notaport").contains("invalid port"));
        if !TLS {
            assert!(reason("rediss://127.0.0.1:6379").contains("tls"));
        }
        assert!(check(0, "redis://127.0.0.1:6379/2").is_ok());
        assert!(check(0, "redis://127.0.0.1:6379/").is_ok());
        for path in ["abc", "2/3", "256", "-1"] {
            let why = reason(&format!("redis://127.0.0.1:7701/{path}"));
            assert!(why.contains("database number"), "{path}: {why}");
            assert!(why.contains(&format!("\"/{path}\"")), "{path}: {why}");
        }
        assert!(check(0, "redis-cluster://127.0.0.1:6379/x").is_ok());
        assert!(check(0, "REDIS://127.0.0.1:6379").is_ok());
        assert!(check(0, "valkey://user:pw@127.0.0.1:6379").is_ok());
    }

    #[test]
    fn unix_socket_urls() {
        assert_eq!(
            normalized(" unix:///run/r.sock "),
            "redis+unix:///run/r.sock"
        );
        assert_eq!(normalized("redis://h:1"), "redis://h:1");
        for url in [
            "unix:///run/r.sock",
            "redis+unix:///run/r.sock",
            "valkey+unix:///r.sock",
        ] {
            if UNIX {
                assert!(check(0, url).is_ok(), "{url}");
            } else {
                assert!(reason(url).contains("`unix-sockets` feature"), "{url}");
            }
        }
        if UNIX {
            assert!(reason("redis+unix://").contains("names no socket"));
            assert!(reason("unix:///run/").contains("names no socket"));
            assert!(check(0, "redis+unix://u:hunter2@localhost/run/r.sock").is_ok());
        }
    }

    #[test]
    fn redaction_is_structural() {
        assert_eq!(
            redact("redis://user:hunter2@host:1/0"),
            "redis://user:***@host:1/0"
        );
        assert_eq!(redact("redis://:a@host:1"), "redis://:***@host:1");
        assert_eq!(redact("redis://a@host:1"), "redis://***@host:1");
        // A one-letter password that also occurs elsewhere leaves the rest intact.
        assert_eq!(
            redact("redis://u:o@host:InvalidPort"),
            "redis://u:***@host:InvalidPort"
        );
        assert_eq!(redact(""), "");
        assert_eq!(redact("redis://host:1"), "redis://host:1");
        assert_eq!(
            redact("redis-sentinel://h:1/0?sentinelServiceName=m&sentinelPassword=hunter2"),
            "redis-sentinel://h:1/0?sentinelServiceName=m&sentinelPassword=***"
        );
        assert_eq!(redact("user:hunter2@host"), "<unparsable URL>");
    }
}
