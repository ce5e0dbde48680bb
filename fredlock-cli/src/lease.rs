//! `fredlock acquire`, `fredlock extend --lease` and `fredlock release --lease`: a lock taken in
//! one step of a pipeline and released in a later one, by another process, through its lease
//! (one line of text on stdout).

use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use fredlock::{AcquireOptions, Error, Lease};

use crate::common::{connect, Common};
use crate::duration::{self, show};
use crate::exit;

/// `fredlock acquire`.
#[derive(Args, Debug)]
pub struct AcquireArgs {
    /// The lock's name.
    name: String,
    /// Lock TTL: nothing keeps the lock alive; extend it with `fredlock extend --lease`.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
    /// Wait at most this long for the lock (default: one attempt).
    #[arg(long, value_parser = duration::parse)]
    wait: Option<Duration>,
    /// Owner label stored with the lock, shown by `inspect` (default: host:pid).
    #[arg(long, env = "FREDLOCK_LABEL")]
    label: Option<String>,
    /// Exit code when the lock is held by someone else.
    #[arg(long, default_value_t = exit::CONFLICT, value_parser = clap::value_parser!(i32).range(0..=255))]
    conflict_exit_code: i32,
}

/// The lease argument of `extend` and `release`.
#[derive(Args)]
pub struct LeaseArg {
    /// The lease `fredlock acquire` printed; `-` reads it from stdin. It is a secret (it
    /// releases the lock): prefer FREDLOCK_LEASE or stdin to the command line, which other
    /// users of the machine can see.
    #[arg(
        long,
        env = "FREDLOCK_LEASE",
        hide_env_values = true,
        value_name = "LEASE"
    )]
    lease: String,
}

impl std::fmt::Debug for LeaseArg {
    // The lease is a secret: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseArg { lease: *** }")
    }
}

/// `fredlock extend`.
#[derive(Args, Debug)]
pub struct ExtendArgs {
    #[command(flatten)]
    lease: LeaseArg,
    /// The new TTL, from now.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
}

/// `fredlock release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    lease: LeaseArg,
}

/// Acquires NAME and prints its lease; nothing is released when this process exits.
pub async fn acquire(common: &Common, a: AcquireArgs) -> i32 {
    let redlock = match connect(common, a.label.as_deref()).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let options = AcquireOptions::new().wait(a.wait.unwrap_or(Duration::ZERO));
    let code = match redlock
        .acquire_using(a.name.as_str(), a.ttl, &options)
        .await
    {
        Ok(lock) => {
            println!("{}", lock.into_lease());
            exit::OK
        }
        Err(Error::Contended { attempts, .. }) => {
            eprintln!(
                "fredlock: {:?} is held by someone else ({attempts} attempt(s){})",
                a.name,
                a.wait.map_or(String::new(), |w| format!(" in {}", show(w)))
            );
            a.conflict_exit_code
        }
        Err(e) => exit::fail(&e),
    };
    redlock.close().await;
    code
}

/// Extends the lock of a lease and prints the new lease (its deadline moved).
pub async fn extend(common: &Common, a: ExtendArgs) -> i32 {
    let Some(lease) = read_lease(&a.lease) else {
        return exit::USAGE;
    };
    let redlock = match connect(common, None).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let extended = async {
        let mut lock = redlock.resume(lease).await?;
        match lock.extend(a.ttl).await {
            Ok(()) => Ok(lock.into_lease()),
            Err(e) => {
                // Never released here: the lease still stands for the lock (a node timing out
                // does not end it; its own deadline does).
                drop(lock.into_lease());
                Err::<Lease, Error>(e)
            }
        }
    };
    let code = match extended.await {
        Ok(lease) => {
            println!("{lease}");
            exit::OK
        }
        Err(e) => not_held_or_fail(&e),
    };
    redlock.close().await;
    code
}

/// Releases the lock of a lease.
pub async fn release(common: &Common, a: ReleaseArgs) -> i32 {
    let Some(lease) = read_lease(&a.lease) else {
        return exit::USAGE;
    };
    let redlock = match connect(common, None).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let code = match redlock.release_lease(&lease).await {
        Ok(_) => exit::OK,
        Err(e) => not_held_or_fail(&e),
    };
    redlock.close().await;
    code
}

/// The lease from the argument, or stdin's first line for `-`; `None` after saying why not.
fn read_lease(arg: &LeaseArg) -> Option<Lease> {
    let text = if arg.lease.trim() == "-" {
        let mut line = String::new();
        if let Err(e) = std::io::stdin().lock().read_line(&mut line) {
            eprintln!("fredlock: cannot read the lease from stdin: {e}");
            return None;
        }
        line
    } else {
        arg.lease.clone()
    };
    match text.parse::<Lease>() {
        Ok(lease) => Some(lease),
        Err(e) => {
            eprintln!("fredlock: {e}");
            None
        }
    }
}

/// The lease no longer holds the lock: its own exit code; other errors as usual.
fn not_held_or_fail(e: &Error) -> i32 {
    match e {
        Error::NotHeld { .. } => {
            eprintln!("fredlock: {e}");
            exit::LOST
        }
        _ => exit::fail(e),
    }
}
