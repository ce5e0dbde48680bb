//! Which nodes a test runs against: [`TestNodes`], local processes or the external nodes that
//! `FREDLOCK_NODES` lists ([`from_env_or_start`], [`env_nodes`]). Owns the choice only: starting
//! and controlling local nodes is [`LocalNodes`]' job.

use std::io;

use crate::server::LocalNodes;

/// Environment variable with comma-separated `redis://` URLs of external nodes.
pub(crate) const NODES_ENV: &str = "FREDLOCK_NODES";

/// Nodes for a test: local redis-server processes, or external nodes named by
/// the `FREDLOCK_NODES` environment variable.
#[derive(Debug)]
pub enum TestNodes {
    /// Processes started by [`LocalNodes::start`]; node control is available.
    Local(LocalNodes),
    /// `redis://` URLs from `FREDLOCK_NODES`; no node control.
    External(Vec<String>),
}

impl TestNodes {
    /// URLs of the nodes, in order.
    pub fn urls(&self) -> Vec<String> {
        match self {
            TestNodes::Local(nodes) => nodes.urls(),
            TestNodes::External(urls) => urls.clone(),
        }
    }

    /// The local nodes, if these are local (tests that kill or pause nodes
    /// should skip when this is `None`).
    pub fn local(&self) -> Option<&LocalNodes> {
        match self {
            TestNodes::Local(nodes) => Some(nodes),
            TestNodes::External(_) => None,
        }
    }

    /// Mutable access to the local nodes, if these are local.
    pub fn local_mut(&mut self) -> Option<&mut LocalNodes> {
        match self {
            TestNodes::Local(nodes) => Some(nodes),
            TestNodes::External(_) => None,
        }
    }
}

/// Uses the first `n` URLs of `FREDLOCK_NODES` (comma-separated `redis://`
/// URLs) when it names at least `n` nodes; otherwise starts `n` local nodes.
pub async fn from_env_or_start(n: usize) -> io::Result<TestNodes> {
    if let Some(urls) = std::env::var(NODES_ENV)
        .ok()
        .and_then(|list| external_urls(&list, n))
    {
        return Ok(TestNodes::External(urls));
    }
    LocalNodes::start(n).await.map(TestNodes::Local)
}

/// Every URL named by `FREDLOCK_NODES`, if it names any (for programs that use exactly the
/// nodes listed, however many).
pub fn env_nodes() -> Option<Vec<String>> {
    let urls = parse_list(&std::env::var(NODES_ENV).ok()?);
    (!urls.is_empty()).then_some(urls)
}

/// The URLs of a comma-separated list, trimmed, empty entries skipped.
fn parse_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The first `n` URLs of a comma-separated list, if it has at least `n`.
fn external_urls(list: &str, n: usize) -> Option<Vec<String>> {
    let urls = parse_list(list);
    (urls.len() >= n).then(|| urls.into_iter().take(n).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn external_urls_need_enough_nodes() {
        let list = " redis://a:1 , redis://b:2,,redis://c:3";
        assert_eq!(
            super::external_urls(list, 2),
            Some(vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()])
        );
        assert_eq!(super::external_urls(list, 3).map(|u| u.len()), Some(3));
        assert_eq!(super::external_urls(list, 4), None);
        assert_eq!(super::external_urls("", 1), None);
    }
}
