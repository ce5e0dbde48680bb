//! Redis Cluster key placement: the hash slot of a key (CRC16 of the key, or of its hash tag,
//! modulo 16384), and how fredlock names the keys that must share a lock's slot.
//!
//! A script touches keys of ONE slot on a cluster shard (CROSSSLOT otherwise), so:
//! - a fencing counter shares its lock key's slot: `P~fence:{Pname}` for a lock key `Pname`
//!   without a hash tag (the braces make the cluster hash the whole lock key), `P~fence:name`
//!   when the lock key has a tag of its own (the tag is kept);
//! - all keys of one semaphore share a slot: `P~sem:{name}:0..n` and `P~sem:{name}:permits`.
//!
//! Owns: the slot function, the naming rules and the check of a caller's name. Must not: know about nodes or connections.

/// Resource names starting with this are fredlock's own (fencing counters, semaphore slots):
/// a caller's name may not start with it, so no lock key can collide with one of them.
pub(crate) const RESERVED: &str = "~";

use crate::base::error::InvalidInput;

/// The longest resource name accepted, in bytes. Every command of a lock carries the name (and
/// a key built from it) to every node, so a name of a megabyte makes each acquire cost tens of
/// milliseconds; 4 KiB holds any path or composite key. Hash a longer name (for example to its
/// SHA-256 in hex) and lock the hash.
pub const MAX_RESOURCE_LEN: usize = 4096;

/// Checks a caller's resource name: [`check_size`], and not starting with [`RESERVED`].
pub(crate) fn check_name(name: &str) -> Result<(), InvalidInput> {
    check_size(name)?;
    if name.starts_with(RESERVED) {
        return Err(InvalidInput::ReservedResource(name.to_string()));
    }
    Ok(())
}

/// Checks a name to read or to break (fredlock's own keys included): not empty, and at most
/// [`MAX_RESOURCE_LEN`] bytes.
pub(crate) fn check_size(name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() {
        return Err(InvalidInput::EmptyResource);
    }
    if name.len() > MAX_RESOURCE_LEN {
        let mut end = 40;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        return Err(InvalidInput::ResourceTooLong {
            start: name[..end].to_string(),
            len: name.len(),
            max: MAX_RESOURCE_LEN,
        });
    }
    Ok(())
}

/// How a resource name is shown in errors: a semaphore slot (`~sem:{pool}:3`, an internal
/// name) as its semaphore and permit, `pool (permit 3)`; any other name as it is.
pub(crate) fn shown(resource: &str) -> String {
    let slot = resource
        .strip_prefix(RESERVED)
        .and_then(|r| r.strip_prefix("sem:{"))
        .and_then(|r| r.rsplit_once("}:"))
        .filter(|(_, part)| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    match slot {
        Some((name, part)) => format!("{name} (permit {part})"),
        None => resource.to_string(),
    }
}

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
    derived_key(prefix, reserved, "fence", resource)
}

/// A key of kind `kind` that belongs to a lock key (its fencing counter, an election's record),
/// in the lock key's slot whenever the prefix allows it: `P~kind:{Pname}`, or `P~kind:name`
/// when the lock key has a hash tag of its own.
pub(crate) fn derived_key(prefix: &str, reserved: &str, kind: &str, resource: &str) -> String {
    let lock = format!("{prefix}{resource}");
    if tag(&lock).is_some() || lock.contains('}') {
        format!("{prefix}{reserved}{kind}:{resource}")
    } else {
        format!("{prefix}{reserved}{kind}:{{{lock}}}")
    }
}

/// The resource name of slot `i` of semaphore `name` (its key is the prefix plus this).
pub(crate) fn semaphore_part(reserved: &str, name: &str, part: &str) -> String {
    format!("{reserved}sem:{{{name}}}:{part}")
}

/// The key of a lock key's wait line (and, with `|member` appended, of each waiter's lease in
/// it), in the lock key's slot and under the key prefix (an ACL limited to the prefix covers
/// it): `P~line:name` when the lock key `Pname` has a hash tag of its own (kept), else
/// `P~line:{Pname}`.
pub(crate) fn line_key(prefix: &str, lock_key: &str) -> String {
    let rest = lock_key.strip_prefix(prefix).unwrap_or(lock_key);
    if tag(lock_key).is_some() || lock_key.contains('}') {
        format!("{prefix}~line:{rest}")
    } else {
        format!("{prefix}~line:{{{lock_key}}}")
    }
}

/// The gate of `key` among `nodes` (their addresses): the node with the highest rendezvous
/// score, so every process that lists the same nodes, in any order, picks the same gate, and
/// keys spread evenly over the nodes. The hash is FNV-1a 64 with a final mix: fixed, unlike
/// std's hasher, so processes built by different compilers agree.
pub(crate) fn gate<'a>(
    nodes: impl IntoIterator<Item = (usize, &'a str)>,
    key: &str,
) -> Option<usize> {
    nodes
        .into_iter()
        .max_by_key(|(i, addr)| (rendezvous(addr, key), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
}

fn rendezvous(addr: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in addr.as_bytes().iter().chain(&[0xff]).chain(key.as_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser: FNV's low bits alone spread poorly over a few nodes.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
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
    fn line_keys_share_the_lock_slot_and_gates_agree() {
        for key in [
            "fredlock:x",
            "fredlock:{user1}:a",
            "fredlock:~sem:{s}:permits",
        ] {
            let line = line_key("fredlock:", key);
            assert!(line.starts_with("fredlock:~line:"), "{line}");
            assert_eq!(slot(key), slot(&line), "{key} vs {line}");
            assert_eq!(slot(key), slot(&format!("{line}|abc:1")));
        }
        let a = [
            (0, "127.0.0.1:7001"),
            (1, "127.0.0.1:7002"),
            (2, "127.0.0.1:7003"),
        ];
        let b = [
            (0, "127.0.0.1:7003"),
            (1, "127.0.0.1:7001"),
            (2, "127.0.0.1:7002"),
        ];
        let mut counts = [0usize; 3];
        for k in 0..3000 {
            let key = format!("fredlock:k{k}");
            let ga = gate(a, &key).unwrap_or(9);
            let gb = gate(b, &key).unwrap_or(9);
            // The same server wins whatever the configuration order.
            assert_eq!(a[ga].1, b[gb].1);
            counts[ga] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "uneven gates: {counts:?}");
        assert_eq!(gate(std::iter::empty(), "k"), None);
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
