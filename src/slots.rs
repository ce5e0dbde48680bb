//! Redis Cluster key placement: the hash slot of a key (CRC16 of the key, or of its hash tag,
//! modulo 16384), and how fredlock names the keys that must share a lock's slot.
//!
//! A script touches keys of ONE slot on a cluster shard (CROSSSLOT otherwise), so:
//! - a fencing counter shares its lock key's slot: `P~fence:{Pname}` for a lock key `Pname`
//!   without a hash tag (the braces make the cluster hash the whole lock key), `P~fence:name`
//!   when the lock key has a tag of its own (the tag is kept);
//! - all keys of one semaphore share a slot: `P~sem:{name}:0..n` and `P~sem:{name}:permits`.
//!
//! Owns: the slot function and the naming rules. Must not: know about nodes or connections.

/// Number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The part of `key` the cluster hashes: the content of the first `{...}` when it is not empty,
/// the whole key otherwise.
pub(crate) fn hash_part(key: &str) -> &[u8] {
    tag(key).unwrap_or(key.as_bytes())
}

/// The hash tag of `key`, if it has one.
pub(crate) fn tag(key: &str) -> Option<&[u8]> {
    let bytes = key.as_bytes();
    let open = bytes.iter().position(|&b| b == b'{')?;
    let close = bytes[open + 1..].iter().position(|&b| b == b'}')? + open + 1;
    (close > open + 1).then(|| &bytes[open + 1..close])
}

/// The hash slot of `key`.
pub(crate) fn slot(key: &str) -> u16 {
    crc16(hash_part(key)) % SLOTS
}

/// The key of a lock key's fencing counter, in the lock key's slot whenever the prefix allows it
/// (`prefix` and `resource` make the lock key `prefix + resource`).
pub(crate) fn fence_key(prefix: &str, reserved: &str, resource: &str) -> String {
    let lock = format!("{prefix}{resource}");
    if tag(&lock).is_some() || lock.contains('}') {
        format!("{prefix}{reserved}fence:{resource}")
    } else {
        format!("{prefix}{reserved}fence:{{{lock}}}")
    }
}

/// The resource name of slot `i` of semaphore `name` (its key is the prefix plus this).
pub(crate) fn semaphore_part(reserved: &str, name: &str, part: &str) -> String {
    format!("{reserved}sem:{{{name}}}:{part}")
}

/// The resource name of part `part` of read-write lock `name` (its key is the prefix plus this):
/// every part of one lock shares the hash tag `{name}`, so one script takes them all.
pub(crate) fn rwlock_part(reserved: &str, name: &str, part: &str) -> String {
    format!("{reserved}rw:{{{name}}}:{part}")
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster uses.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from Redis' own CLUSTER KEYSLOT.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(hash_part("foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_part("foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_part("foo{bar}{zap}"), b"bar");
    }

    #[test]
    fn derived_keys_share_the_lock_slot() {
        for resource in ["x", "orders:42", "{user1}:a", "a{b", "a}b{c}", "{}", "é"] {
            let lock = format!("fredlock:{resource}");
            let fence = fence_key("fredlock:", "~", resource);
            if !resource.contains('}') || tag(&lock).is_some() {
                assert_eq!(slot(&lock), slot(&fence), "{lock} vs {fence}");
            }
        }
        assert_eq!(fence_key("p:", "~", "x"), "p:~fence:{p:x}");
        assert_eq!(fence_key("p:", "~", "{t}x"), "p:~fence:{t}x");
        for name in ["api", "{t}api", "a{b", "a}b"] {
            let meta = format!("p:{}", semaphore_part("~", name, "permits"));
            for i in 0..5 {
                let key = format!("p:{}", semaphore_part("~", name, &i.to_string()));
                assert_eq!(slot(&key), slot(&meta));
                assert_eq!(
                    slot(&fence_key(
                        "p:",
                        "~",
                        &semaphore_part("~", name, &i.to_string())
                    )),
                    slot(&meta)
                );
            }
        }
    }
}
