//! What a lock key holds: the holder's secret token, then [`SEPARATOR`] and the owner label.
//!
//! Every script compares the WHOLE stored value, so a holder proves itself with the token (the
//! part nobody else knows) and the label only says, in public, who that is: knowing the label
//! helps nobody to delete or extend a lock. A value is split at its FIRST separator; tokens never
//! contain one (fresh tokens are hex digits, custom tokens are checked), and labels may not
//! contain control characters, the separator among them. A value with no separator (an older
//! fredlock, or something else entirely) has no label; its fingerprint is taken over all of it.
//!
//! The fingerprint is the first 12 hex digits of the SHA-1 of the token: enough to tell holders
//! apart in `inspect` and to match a holder's own [`Lock::fingerprint`](crate::Lock::fingerprint),
//! useless for guessing a 128-bit token.
//!
//! Owns: the value format, label and token validation, the default label, fingerprints.
//! Must not: send anything, or know about locks (pure functions over strings).

use crate::base::error::InvalidInput;

/// Separates the secret token from the owner label in a lock's stored value (ASCII 0x1F, the
/// unit separator): never part of a token or a label.
pub const SEPARATOR: char = '\x1f';

/// The longest owner label accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// The longest custom token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;

/// Hex digits of a fingerprint.
const FINGERPRINT_LEN: usize = 12;

/// Checks an owner label: at most [`MAX_LABEL_LEN`] bytes, no control character (the
/// separator is one). An empty label is valid and means "no label".
pub(crate) fn check_label(label: &str) -> Result<(), InvalidInput> {
    if label.len() > MAX_LABEL_LEN {
        return Err(InvalidInput::InvalidLabel {
            label: shorten(label),
            reason: "longer than 256 bytes",
        });
    }
    if label.chars().any(char::is_control) {
        return Err(InvalidInput::InvalidLabel {
            label: label.escape_debug().to_string(),
            reason: "not printable (it contains a control character: a newline, a tab, an escape, 0x1f, ...)",
        });
    }
    Ok(())
}

/// Checks a caller's token: not empty, at most [`MAX_TOKEN_LEN`] bytes, no [`SEPARATOR`]. The
/// error never repeats the token (it is a secret).
pub(crate) fn check_token(token: &str) -> Result<(), InvalidInput> {
    let reason = if token.is_empty() {
        "it is empty"
    } else if token.len() > MAX_TOKEN_LEN {
        "it is longer than 256 bytes"
    } else if token.contains(SEPARATOR) {
        "it contains the separator 0x1f"
    } else {
        return Ok(());
    };
    Err(InvalidInput::InvalidToken { reason })
}

/// The value stored at a lock's keys: `token`, or `token SEPARATOR label` with a label.
pub(crate) fn value(token: &str, label: &str) -> String {
    if label.is_empty() {
        token.to_string()
    } else {
        format!("{token}{SEPARATOR}{label}")
    }
}

/// A stored value's token part and its label (`None` without a separator).
pub(crate) fn split(value: &str) -> (&str, Option<&str>) {
    match value.split_once(SEPARATOR) {
        Some((token, label)) => (token, Some(label)),
        None => (value, None),
    }
}

/// The public fingerprint of a token: 12 hex digits of its SHA-1.
pub(crate) fn fingerprint(token: &str) -> String {
    let mut hash = fred::util::sha1_hash(token);
    hash.truncate(FINGERPRINT_LEN);
    hash
}

/// `host:pid`: the host name (from the kernel, else `$HOSTNAME`, else `unknown-host`) and this
/// process's id, made a valid label (control characters dropped, bounded).
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| !c.is_control())
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string());
    let pid = std::process::id();
    let mut host = host;
    // Leave room for ":" and the pid.
    while host.len() > MAX_LABEL_LEN - 12 {
        host.pop();
    }
    format!("{host}:{pid}")
}

/// The first bytes of a long label, for an error message.
fn shorten(label: &str) -> String {
    let mut end = 40.min(label.len());
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", label[..end].escape_debug())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_splits_back_into_token_and_label() {
        let v = value("abc", "host:1");
        assert_eq!(split(&v), ("abc", Some("host:1")));
        assert_eq!(split(&value("abc", "")), ("abc", None));
        // Only the first separator splits (a foreign value may hold more).
        assert_eq!(split("a\x1fb\x1fc"), ("a", Some("b\x1fc")));
        assert_eq!(split("plain"), ("plain", None));
    }

    #[test]
    fn labels_are_bounded_and_printable() {
        assert!(check_label("").is_ok());
        assert!(check_label("backup job on db-1 (pid 42) ✓").is_ok());
        assert!(check_label(&"x".repeat(MAX_LABEL_LEN)).is_ok());
        assert!(check_label(&"x".repeat(MAX_LABEL_LEN + 1)).is_err());
        assert!(check_label(&"é".repeat(200)).is_err());
        for bad in ["a\nb", "a\x1fb", "\t", "\x1b[31m", "nul\0"] {
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tokens_are_checked_without_being_shown() {
        assert!(check_token("s3cret-token").is_ok());
        assert!(check_token("").is_err());
        assert!(check_token(&"t".repeat(MAX_TOKEN_LEN + 1)).is_err());
        let err = check_token("s3cret\x1fx").expect_err("separator");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn fingerprints_are_short_stable_and_differ() {
        let a = fingerprint("0123456789abcdef0123456789abcdef");
        assert_eq!(a.len(), FINGERPRINT_LEN);
        assert_eq!(a, fingerprint("0123456789abcdef0123456789abcdef"));
        assert_ne!(a, fingerprint("0123456789abcdef0123456789abcdee"));
    }

    #[test]
    fn the_default_label_is_valid_and_names_this_process() {
        let label = default_label();
        assert!(check_label(&label).is_ok(), "{label:?}");
        assert!(
            label.ends_with(&format!(":{}", std::process::id())),
            "{label}"
        );
    }
}
