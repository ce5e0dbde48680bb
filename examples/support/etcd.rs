//! etcd 3.4 as a peer of the fleet table: one etcd member on tmpfs ([`EtcdServer`], started by
//! the bench when `etcd` is on PATH; `make bench` installs Debian's etcd-server where apt can)
//! and a client of etcd's JSON gateway ([`Etcd`]: HTTP/1.1 on one kept-alive connection) for a
//! lease, the lock service (etcd's `concurrency.Mutex`, run inside the server) and the election
//! service (`concurrency.Election`). A Go program would call the same services over gRPC; the
//! gateway adds one loopback hop inside etcd, which favours neither side by much at these
//! rates (a lock call costs etcd a raft round and a write either way).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// TTL of every lease a fleet child grants: longer than any cell, so nothing expires inside one.
pub const LEASE_TTL_S: u64 = 60;
/// How long [`EtcdServer::start`] waits for the member to answer.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// One local etcd member (single-node cluster) with its data on tmpfs; killed and its data
/// removed on drop.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:<port>`, the client URL.
    pub url: String,
    /// `etcd --version`'s first line.
    pub version: String,
}

impl EtcdServer {
    /// Starts the member and waits until it grants a lease; why not, when it cannot.
    pub async fn start() -> Result<EtcdServer, String> {
        let version = Command::new("etcd")
            .arg("--version")
            .output()
            .map_err(|e| format!("etcd is not on PATH ({e}); `make bench` installs it with apt"))?;
        let version = String::from_utf8_lossy(&version.stdout)
            .lines()
            .next()
            .unwrap_or("etcd")
            .to_string();
        let shm = PathBuf::from("/dev/shm");
        let base = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let (client, peer) = (free_port()?, free_port()?);
        let dir = base.join(format!(
            "fredlock-bench-etcd-{}-{client}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "bench", "--log-level", "error"])
            .arg("--data-dir")
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?;
        let server = EtcdServer {
            child,
            dir,
            url,
            version,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let answer = async { Etcd::connect(&server.url).await?.grant(5).await };
            match answer.await {
                Ok(_) => return Ok(server),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "etcd at {} did not answer in {START_TIMEOUT:?}: {e}",
                        server.url
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port (bound and let go: another process could take it in between, which a
/// bench can live with: etcd then fails to start and its cells are skipped).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// A client of etcd's JSON gateway on one kept-alive HTTP/1.1 connection. A call dropped
/// before its answer leaves the connection unusable (the answer would be read by the next
/// call): drop the client with it.
pub struct Etcd {
    stream: BufReader<TcpStream>,
    host: String,
}

impl Etcd {
    /// Connects to `url` (`http://host:port`).
    pub async fn connect(url: &str) -> Result<Etcd, String> {
        let host = url.trim_start_matches("http://").trim_end_matches('/');
        let stream = TcpStream::connect(host)
            .await
            .map_err(|e| format!("connect to etcd at {host}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Etcd {
            stream: BufReader::new(stream),
            host: host.to_string(),
        })
    }

    /// Grants a lease of `ttl_s` seconds; its id (a decimal string, as the gateway writes it).
    pub async fn grant(&mut self, ttl_s: u64) -> Result<String, String> {
        let reply = self
            .post("/v3/lease/grant", json!({ "TTL": ttl_s }))
            .await?;
        field(&reply, "ID")
    }

    /// Waits for and takes the lock `name` under `lease`; the lock's own key (base64), for
    /// [`Etcd::unlock`].
    pub async fn lock(&mut self, name: &str, lease: &str) -> Result<String, String> {
        let body = json!({ "name": base64(name.as_bytes()), "lease": lease });
        field(&self.post("/v3/lock/lock", body).await?, "key")
    }

    /// Releases the lock whose key [`Etcd::lock`] returned.
    pub async fn unlock(&mut self, key: &str) -> Result<(), String> {
        self.post("/v3/lock/unlock", json!({ "key": key }))
            .await
            .map(drop)
    }

    /// Campaigns for the election `name` under `lease` until elected; the leader record, for
    /// [`Etcd::resign`].
    pub async fn campaign(&mut self, name: &str, lease: &str) -> Result<Value, String> {
        let body =
            json!({ "name": base64(name.as_bytes()), "lease": lease, "value": base64(b"x") });
        let mut reply = self.post("/v3/election/campaign", body).await?;
        match reply.get_mut("leader") {
            Some(leader) => Ok(leader.take()),
            None => Err(format!("campaign: no leader in {reply}")),
        }
    }

    /// Resigns the leadership `leader` (from [`Etcd::campaign`]).
    pub async fn resign(&mut self, leader: Value) -> Result<(), String> {
        self.post("/v3/election/resign", json!({ "leader": leader }))
            .await
            .map(drop)
    }

    /// One POST and its JSON answer; an error with etcd's own words for any status but 200.
    async fn post(&mut self, path: &str, body: Value) -> Result<Value, String> {
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let io = |e: std::io::Error| format!("etcd {path}: {e}");
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .map_err(io)?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await.map_err(io)?;
        let status = line.split(' ').nth(1).unwrap_or("").to_string();
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await.map_err(io)? == 0 {
                return Err(format!("etcd {path}: connection closed"));
            }
            let header = line.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(n) = header.strip_prefix("content-length:") {
                length = n.trim().parse::<usize>().ok();
            }
            chunked |= header == "transfer-encoding: chunked";
        }
        let bytes = match (length, chunked) {
            (Some(n), _) => {
                let mut buf = vec![0; n];
                self.stream.read_exact(&mut buf).await.map_err(io)?;
                buf
            }
            (None, true) => self.chunks().await.map_err(io)?,
            (None, false) => return Err(format!("etcd {path}: an answer without a length")),
        };
        let text = String::from_utf8_lossy(&bytes);
        if status != "200" {
            return Err(format!("etcd {path}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("etcd {path}: {e} in {text}"))
    }

    /// A chunked body, whole.
    async fn chunks(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            let mut chunk = vec![0; size + 2];
            self.stream.read_exact(&mut chunk).await?;
            if size == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&chunk[..size]);
        }
    }
}

/// A string field of a gateway answer.
fn field(reply: &Value, name: &str) -> Result<String, String> {
    reply
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("no {name:?} in etcd's answer {reply}"))
}

/// Standard base64 with padding (the gateway's encoding of bytes fields).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
