//! What a cluster node's replies say, for [`LocalCluster`](crate::LocalCluster): the slot
//! table of `CLUSTER SLOTS`, a bulk text, and the errors for a reply that is not the one asked.

use std::io;
use std::ops::RangeInclusive;

use crate::resp::RespValue;

/// `CLUSTER SLOTS` as `(slot range, port of its primary)`.
pub(crate) fn parse_cluster_slots(
    reply: &RespValue,
) -> Result<Vec<(RangeInclusive<u16>, u16)>, String> {
    let bad = || format!("unexpected CLUSTER SLOTS reply {reply:?}");
    let RespValue::Array(Some(entries)) = reply else {
        return Err(bad());
    };
    let number = |v: &RespValue| match v {
        RespValue::Integer(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    entries
        .iter()
        .map(|entry| {
            let RespValue::Array(Some(parts)) = entry else {
                return Err(bad());
            };
            let (Some(first), Some(last)) = (
                parts.first().and_then(number),
                parts.get(1).and_then(number),
            ) else {
                return Err(bad());
            };
            let Some(RespValue::Array(Some(primary))) = parts.get(2) else {
                return Err(bad());
            };
            let port = primary.get(1).and_then(number).ok_or_else(bad)?;
            Ok((first..=last, port))
        })
        .collect()
}

pub(crate) fn bulk_text(what: &str, reply: RespValue) -> io::Result<String> {
    match reply {
        RespValue::Bulk(Some(bytes)) => String::from_utf8(bytes)
            .map_err(|_| invalid_data(format!("{what} answered a value that is not UTF-8"))),
        other => Err(unexpected(what, other)),
    }
}

pub(crate) fn unexpected(what: &str, reply: RespValue) -> io::Error {
    match reply {
        RespValue::Error(e) => io::Error::other(format!("{what} failed: {e}")),
        other => invalid_data(format!("unexpected reply to {what}: {other:?}")),
    }
}

pub(crate) fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}
