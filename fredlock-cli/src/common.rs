//! The options every subcommand shares (`--nodes`, `--prefix`, `--confirm-replicas`) and the
//! `Redlock` they make.
//!
//! Owns reading the node list and building the client, with the exit code when that fails.
//! Must not run a subcommand.

use clap::Args;
use fredlock::Redlock;

use crate::exit;

// The nodes and the key prefix, from the command line or the environment.
#[derive(Args, Debug)]
pub struct Common {
    /// The nodes: independent servers (not replicas of one another), as URLs separated by
    /// commas or spaces.
    #[arg(
        long,
        env = "FREDLOCK_NODES",
        value_delimiter = ',',
        global = true,
        value_name = "URL,URL,..."
    )]
    pub nodes: Vec<String>,
    /// Prefix of every lock key.
    #[arg(
        long,
        env = "FREDLOCK_PREFIX",
        default_value = "fredlock:",
        global = true
    )]
    pub prefix: String,
    /// Count a node's vote for an acquire or an extension only once N of its replicas
    /// acknowledged the write (`WAIT`): for nodes with replicas and automatic failover
    /// (Sentinel groups, managed primaries). `health` then checks that each node has N.
    #[arg(
        long,
        env = "FREDLOCK_CONFIRM_REPLICAS",
        global = true,
        value_name = "N",
        value_parser = clap::value_parser!(u32)
    )]
    pub confirm_replicas: Option<u32>,
    /// With --confirm-replicas: count a vote once the write is fsynced to the append-only file
    /// of the primary and of N replicas (`WAITAOF`; needs appendonly yes; N may be 0).
    #[arg(
        long,
        env = "FREDLOCK_CONFIRM_FSYNC",
        global = true,
        requires = "confirm_replicas"
    )]
    pub confirm_fsync: bool,
    /// How long a node waits for its replicas to confirm a vote (with --confirm-replicas).
    #[arg(
        long,
        env = "FREDLOCK_CONFIRM_TIMEOUT",
        global = true,
        default_value = "100ms",
        value_parser = crate::duration::parse,
        value_name = "DURATION"
    )]
    pub confirm_timeout: std::time::Duration,
}

/// The node URLs, or `None` after saying how to give them. Commas, whitespace or both
/// separate them (a URL holds neither).
pub fn node_urls(common: &Common) -> Option<Vec<String>> {
    let urls: Vec<String> = common
        .nodes
        .iter()
        .flat_map(|u| u.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    if urls.is_empty() {
        eprintln!("fredlock: no nodes: give --nodes redis://HOST:PORT,redis://HOST:PORT,... or set FREDLOCK_NODES");
        return None;
    }
    Some(urls)
}

/// A Redlock over the nodes, or the exit code after printing why not (bad URL, label,
/// duplicate: 64; too few nodes accept our credentials: 69).
pub async fn connect(common: &Common, label: Option<&str>) -> Result<Redlock, i32> {
    let urls = node_urls(common).ok_or(exit::USAGE)?;
    let mut builder = Redlock::builder()
        .nodes(urls)
        .key_prefix(common.prefix.clone());
    if let Some(label) = label {
        builder = builder.owner_label(label);
    }
    builder = match (common.confirm_replicas, common.confirm_fsync) {
        (Some(n), true) => builder.confirm_replicas_fsynced(n, common.confirm_timeout),
        (Some(n), false) => builder.confirm_replicas(n, common.confirm_timeout),
        (None, _) => builder,
    };
    builder.build().await.map_err(|e| exit::fail(&e))
}
