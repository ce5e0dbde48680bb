//! The tiny RESP2 client: [`RespValue`] (encode a command, parse a reply) and one-shot round
//! trips over a fresh connection ([`resp_command`], [`resp_pipeline`]), to talk to a node without
//! going through fred. Owns the wire format only: it must not start, stop or know about server
//! processes.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A reply in the RESP2 protocol, as returned by [`LocalNodes::command`](crate::LocalNodes::command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespValue {
    /// `+...` simple string, e.g. `OK` or `PONG`.
    Simple(String),
    /// `-...` error reply, e.g. `ERR unknown command`.
    Error(String),
    /// `:...` integer reply.
    Integer(i64),
    /// `$...` bulk string; `None` is the null bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*...` array; `None` is the null array (`*-1`).
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// Encodes a command as a RESP2 array of bulk strings, ready to write to a socket.
    pub fn encode_command(args: &[&str]) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Parses one complete RESP2 value from the start of `buf`.
    ///
    /// Returns `Ok(None)` when `buf` holds only a prefix of a value (read more
    /// bytes and call again), `Ok(Some((value, consumed)))` when a whole value
    /// was parsed, and `Err` (kind `InvalidData`) when the bytes are not RESP2.
    pub fn parse(buf: &[u8]) -> io::Result<Option<(RespValue, usize)>> {
        parse_at(buf, 0)
    }
}

/// Parses one value starting at `pos`; returns the value and the position after it.
fn parse_at(buf: &[u8], pos: usize) -> io::Result<Option<(RespValue, usize)>> {
    let Some((line, after_line)) = read_line(buf, pos) else {
        return Ok(None);
    };
    let (&kind, rest) = line
        .split_first()
        .ok_or_else(|| invalid("empty RESP line"))?;
    let text = std::str::from_utf8(rest).map_err(|_| invalid("RESP header is not UTF-8"))?;
    match kind {
        b'+' => Ok(Some((RespValue::Simple(text.to_owned()), after_line))),
        b'-' => Ok(Some((RespValue::Error(text.to_owned()), after_line))),
        b':' => Ok(Some((RespValue::Integer(parse_int(text)?), after_line))),
        b'$' => {
            let len = parse_int(text)?;
            if len == -1 {
                return Ok(Some((RespValue::Bulk(None), after_line)));
            }
            let len = usize::try_from(len).map_err(|_| invalid("negative bulk length"))?;
            let end = after_line + len;
            // The payload is followed by its own CRLF; wait until both arrived.
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            let data = buf[after_line..end].to_vec();
            Ok(Some((RespValue::Bulk(Some(data)), end + 2)))
        }
        b'*' => {
            let count = parse_int(text)?;
            if count == -1 {
                return Ok(Some((RespValue::Array(None), after_line)));
            }
            let count = usize::try_from(count).map_err(|_| invalid("negative array length"))?;
            // Do not trust `count` for the allocation: it comes off the wire.
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = after_line;
            for _ in 0..count {
                match parse_at(buf, at)? {
                    Some((item, next)) => {
                        items.push(item);
                        at = next;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((RespValue::Array(Some(items)), at)))
        }
        other => Err(invalid(&format!(
            "unknown RESP2 type byte {:?}",
            char::from(other)
        ))),
    }
}

/// Finds the CRLF-terminated line starting at `pos`; returns it (without CRLF)
/// and the position after the CRLF, or `None` if the CRLF has not arrived yet.
fn read_line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..cr], pos + cr + 2))
}

fn parse_int(text: &str) -> io::Result<i64> {
    text.parse::<i64>()
        .map_err(|_| invalid(&format!("bad RESP integer {text:?}")))
}

/// An `InvalidData` error saying `msg`.
pub(crate) fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

/// Sends one command to `addr` over a fresh connection and reads one reply,
/// bounded by `timeout` (the error kind is `TimedOut` when it expires).
///
/// This works against any RESP2 server, e.g. a node behind a
/// [`FaultProxy`](crate::FaultProxy) or an external node.
pub async fn resp_command(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> io::Result<RespValue> {
    match tokio::time::timeout(timeout, resp_round_trip(addr, args)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no reply from {addr} within {timeout:?} to {args:?}"),
        )),
    }
}

async fn resp_round_trip(addr: SocketAddr, args: &[&str]) -> io::Result<RespValue> {
    let mut replies = resp_pipeline_round_trip(addr, &[args]).await?;
    Ok(replies.remove(0))
}

/// Sends several commands to `addr` over ONE fresh connection, in order, and reads one reply
/// per command, bounded by `timeout` as a whole (error kind `TimedOut`). For commands whose
/// effect lasts only for the connection, e.g. `ASKING` before a command on a cluster shard
/// that is importing a slot.
pub async fn resp_pipeline(
    addr: SocketAddr,
    commands: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<RespValue>> {
    match tokio::time::timeout(timeout, resp_pipeline_round_trip(addr, commands)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no replies from {addr} within {timeout:?} to {commands:?}"),
        )),
    }
}

async fn resp_pipeline_round_trip(
    addr: SocketAddr,
    commands: &[&[&str]],
) -> io::Result<Vec<RespValue>> {
    let mut stream = TcpStream::connect(addr).await?;
    let request: Vec<u8> = commands
        .iter()
        .flat_map(|args| RespValue::encode_command(args))
        .collect();
    stream.write_all(&request).await?;
    let mut buf = Vec::with_capacity(512);
    let mut replies = Vec::with_capacity(commands.len());
    while replies.len() < commands.len() {
        // Replies may arrive in several TCP segments: re-parse after each read
        // until a whole value is buffered.
        if let Some((value, used)) = RespValue::parse(&buf)? {
            buf.drain(..used);
            replies.push(value);
            continue;
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{addr} closed the connection before a full reply"),
            ));
        }
    }
    Ok(replies)
}
/// `Ok` when `reply` is `+OK`, else the error [`unexpected`] gives.
pub(crate) fn expect_ok(what: &str, reply: RespValue) -> io::Result<()> {
    match reply {
        RespValue::Simple(s) if s == "OK" => Ok(()),
        other => Err(unexpected(what, other)),
    }
}

/// An error for a reply that is not what `what` should answer (the server's own words when it
/// is an error reply).
pub(crate) fn unexpected(what: &str, reply: RespValue) -> io::Error {
    match reply {
        RespValue::Error(e) => io::Error::other(format!("{what} failed: {e}")),
        other => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply to {what}: {other:?}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::RespValue;

    #[test]
    fn parses_every_type_and_partial_input() {
        let wire = b"*5\r\n+OK\r\n-ERR bad\r\n:-42\r\n$3\r\na\r\n\r\n*2\r\n$-1\r\n*-1\r\n";
        let expected = RespValue::Array(Some(vec![
            RespValue::Simple("OK".into()),
            RespValue::Error("ERR bad".into()),
            RespValue::Integer(-42),
            RespValue::Bulk(Some(b"a\r\n".to_vec())),
            RespValue::Array(Some(vec![RespValue::Bulk(None), RespValue::Array(None)])),
        ]));
        // Every strict prefix is incomplete, never an error.
        for cut in 0..wire.len() {
            assert_eq!(RespValue::parse(&wire[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(
            RespValue::parse(wire).unwrap(),
            Some((expected, wire.len()))
        );
        // Trailing bytes are left for the next value.
        let (v, used) = RespValue::parse(b":1\r\n:2\r\n").unwrap().unwrap();
        assert_eq!((v, used), (RespValue::Integer(1), 4));
    }

    #[test]
    fn rejects_garbage() {
        assert!(RespValue::parse(b"?x\r\n").is_err());
        assert!(RespValue::parse(b":abc\r\n").is_err());
        assert!(RespValue::parse(b"$1\r\nab\r\n").is_err());
    }

    #[test]
    fn encodes_commands() {
        assert_eq!(
            RespValue::encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }
}
