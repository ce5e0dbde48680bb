//! What a Redis Cluster's replies say, decoded: the slot table `CLUSTER SLOTS` lists (and who
//! owns a slot in it) and the `MOVED`/`ASK` redirects in error replies.
//!
//! Owns: parsing those replies and looking up a slot's owner. Must not: talk to a shard, hold
//! the live table or follow a redirect (`cluster` does).

use std::collections::HashMap;

use fred::prelude::{ErrorKind, Value};

use crate::base::slots;

/// The slot table: ranges from `CLUSTER SLOTS`, and single slots a `MOVED` moved since.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) ranges: Vec<(u16, u16, String)>,
    pub(crate) moved: HashMap<u16, String>,
}

impl Table {
    pub(crate) fn owner(&self, slot: u16) -> Option<&str> {
        if let Some(addr) = self.moved.get(&slot) {
            return Some(addr);
        }
        let i = self.ranges.partition_point(|(_, end, _)| *end < slot);
        match self.ranges.get(i) {
            Some((start, _, addr)) if *start <= slot => Some(addr),
            _ => None,
        }
    }
}

/// What `CLUSTER SLOTS` said.
pub(crate) struct Topology {
    pub(crate) table: Table,
    /// The smallest node id seen: the cluster's identity.
    pub(crate) id: String,
    pub(crate) replicas: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Redirect {
    Moved,
    Ask,
}

/// `MOVED <slot> <host:port>` or `ASK <slot> <host:port>`.
pub(crate) fn redirect(e: &fred::error::Error) -> Option<(Redirect, u16, String)> {
    if *e.kind() != ErrorKind::Cluster {
        return None;
    }
    let mut parts = e.details().split_whitespace();
    let kind = match parts.next()? {
        "MOVED" => Redirect::Moved,
        "ASK" => Redirect::Ask,
        _ => return None,
    };
    let slot = parts
        .next()?
        .parse::<u16>()
        .ok()
        .filter(|s| *s < slots::SLOTS)?;
    Some((kind, slot, parts.next()?.to_string()))
}

pub(crate) fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, ..], replicas..], ..]`.
pub(crate) fn parse_slots(value: &Value, asked: &str) -> Option<Topology> {
    let Value::Array(entries) = value else {
        return None;
    };
    let mut table = Table::default();
    let mut ids: Vec<String> = Vec::new();
    let mut replicas = 0;
    for entry in entries {
        let Value::Array(parts) = entry else {
            return None;
        };
        let [Value::Integer(start), Value::Integer(end), primary, others @ ..] = parts.as_slice()
        else {
            return None;
        };
        let start = u16::try_from(*start).ok().filter(|s| *s < slots::SLOTS)?;
        let end = u16::try_from(*end)
            .ok()
            .filter(|e| *e < slots::SLOTS && *e >= start)?;
        let (host, port, id) = endpoint(primary)?;
        let host = if host.is_empty() || host == "?" {
            asked.to_string()
        } else {
            host
        };
        table.ranges.push((start, end, format!("{host}:{port}")));
        ids.extend(id);
        for other in others {
            ids.extend(endpoint(other)?.2);
            replicas += 1;
        }
    }
    table.ranges.sort_by_key(|(start, _, _)| *start);
    let id = ids.into_iter().min().unwrap_or_default();
    Some(Topology {
        table,
        id,
        replicas,
    })
}

/// `[host, port, id, ..]` (the id is missing before Redis 4).
fn endpoint(value: &Value) -> Option<(String, i64, Option<String>)> {
    let Value::Array(parts) = value else {
        return None;
    };
    let host = parts.first()?.as_string()?;
    let Value::Integer(port) = parts.get(1)? else {
        return None;
    };
    let id = parts.get(2).and_then(Value::as_string);
    Some((host, *port, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_are_parsed() {
        let moved = fred::error::Error::new(ErrorKind::Cluster, "MOVED 3999 127.0.0.1:6381");
        assert_eq!(
            redirect(&moved),
            Some((Redirect::Moved, 3999, "127.0.0.1:6381".into()))
        );
        let ask = fred::error::Error::new(ErrorKind::Cluster, "ASK 1 ::1:7002");
        assert_eq!(redirect(&ask), Some((Redirect::Ask, 1, "::1:7002".into())));
        let down = fred::error::Error::new(ErrorKind::Cluster, "CLUSTERDOWN The cluster is down");
        assert_eq!(redirect(&down), None);
        let bad = fred::error::Error::new(ErrorKind::Cluster, "MOVED 99999 x:1");
        assert_eq!(redirect(&bad), None);
        let other = fred::error::Error::new(ErrorKind::Unknown, "MOVED 1 x:1");
        assert_eq!(redirect(&other), None);
    }

    #[test]
    fn the_table_finds_owners() {
        let value = Value::Array(vec![
            Value::Array(vec![
                Value::Integer(5461),
                Value::Integer(10922),
                Value::Array(vec!["".into(), Value::Integer(7002), "bbb".into()]),
                Value::Array(vec!["10.0.0.9".into(), Value::Integer(7005), "aaa".into()]),
            ]),
            Value::Array(vec![
                Value::Integer(0),
                Value::Integer(5460),
                Value::Array(vec!["10.0.0.1".into(), Value::Integer(7001), "ccc".into()]),
            ]),
        ]);
        let mut t = parse_slots(&value, "10.0.0.2").expect("parsed");
        assert_eq!(t.id, "aaa");
        assert_eq!(t.replicas, 1);
        assert_eq!(t.table.owner(0), Some("10.0.0.1:7001"));
        assert_eq!(t.table.owner(5461), Some("10.0.0.2:7002"));
        assert_eq!(t.table.owner(10922), Some("10.0.0.2:7002"));
        assert_eq!(t.table.owner(10923), None);
        t.table.moved.insert(3, "10.0.0.3:7003".into());
        assert_eq!(t.table.owner(3), Some("10.0.0.3:7003"));
        assert!(parse_slots(&Value::from("x"), "h").is_none());
        let bad = Value::Array(vec![Value::Array(vec![
            Value::Integer(9),
            Value::Integer(2),
            Value::Array(vec!["h".into(), Value::Integer(1)]),
        ])]);
        assert!(parse_slots(&bad, "h").is_none());
    }
}
