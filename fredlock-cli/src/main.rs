//! `fredlock`: a Redlock over independent Redis nodes, from the shell.
//!
//! A thin layer over the library: `run` is flock(1) for a fleet (a lock kept alive while a
//! command runs), `leader` runs a command only while elected, `inspect` and `break` are for
//! operators, `health` checks what the Redlock safety argument assumes of the nodes.
//!
//! This file parses the arguments and hands each subcommand to its file (`run.rs`, `elect.rs`,
//! `show.rs`, `health.rs`, `lease.rs`). Below those: `child.rs` (CMD as a child process),
//! `nodes.rs`, `common.rs` (the shared options and the client they make), `duration.rs` and
//! `exit.rs` (the exit codes). No file imports this one, and no two files import each other
//! (`fredlock-testkit/tests/layers.rs` checks that no import runs in a circle).
#![deny(unsafe_code)]

mod child;
mod common;
mod duration;
mod elect;
mod exit;
mod health;
mod lease;
mod nodes;
mod run;
mod show;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::common::{connect, node_urls, Common};

const EXIT_CODES: &str = "\
EXIT CODES:
  run, leader  CMD's own exit code; 128+N when CMD was killed by signal N
  0            success (inspect, break: every node answered)
  1            health: degraded (a node down, or a warning not --allow'ed);
               inspect, break: a node did not answer (the verdict stands on the others)
  2            health: no quorum of distinct servers reachable
  64           bad usage or input (no nodes, bad URL, label or duration; break without --yes)
  69           nodes unavailable: too few answered to form a quorum (inspect, break); run,
               leader: no quorum answered for --no-quorum-timeout (10s, counted from
               the start: the connect wait is part of it)
  70           internal error
  75           run, acquire: the lock is held by someone else (--no-wait, or --wait ran out);
               --conflict-exit-code changes it
  76           run: the lock was lost while CMD ran (CMD got SIGTERM, then SIGKILL);
               extend, release: the lease no longer holds the lock
  126, 127     CMD is not executable, or was not found

ENVIRONMENT:
  FREDLOCK_NODES   node URLs, separated by commas or spaces (as --nodes)
  FREDLOCK_PREFIX  key prefix (as --prefix)
  FREDLOCK_CONFIRM_REPLICAS, FREDLOCK_CONFIRM_TIMEOUT, FREDLOCK_CONFIRM_FSYNC  as --confirm-replicas,
    --confirm-timeout, --confirm-fsync
  FREDLOCK_LABEL   owner label (as --label)
  FREDLOCK_LEASE   a lease (as --lease)";

/// A quorum lock over independent Redis or Valkey nodes, from the shell.
#[derive(Parser, Debug)]
#[command(name = "fredlock", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD while holding the lock NAME, like flock(1) for a whole fleet.
    ///
    /// The lock is kept alive while CMD runs and released when it exits; CMD's exit code
    /// becomes fredlock's. If the lock is lost, CMD gets SIGTERM, then SIGKILL after
    /// --kill-after. SIGTERM, SIGHUP (and SIGINT, SIGQUIT unless sent by the terminal, which
    /// already reached CMD) are passed on to CMD. On Linux, CMD is killed if fredlock dies.
    Run(RunArgs),
    /// Run CMD only while this process is the elected leader of NAME.
    ///
    /// CMD starts when this process wins, is stopped (SIGTERM, then SIGKILL after
    /// --kill-after) when it loses, and the campaign goes on. When CMD exits by itself,
    /// fredlock resigns and exits with CMD's code. CMD finds the term number (a fencing token:
    /// pass it with its writes) in FREDLOCK_TERM and the campaign value in
    /// FREDLOCK_LEADER_VALUE.
    Leader(LeaderArgs),
    /// Print who leads the election NAME as one JSON line, then one more on every change,
    /// until interrupted: {"leader": {"value": ..., "term": ..., "label": ..., "ttl_ms": ...}}
    /// (label: the leader's owner label, as `leader --label` set it) or {"leader": null}.
    Observe(ObserveArgs),
    /// Show who holds NAME on each node: owner label, token fingerprint, TTL left, verdict.
    Inspect(InspectArgs),
    /// Delete NAME's lock on every node, whoever holds it, and show what was deleted.
    Break(BreakArgs),
    /// Check every node: reachable, round trip, version, duplicates, persistence, eviction
    /// policy, replicas, clock spread.
    Health(HealthArgs),
    /// Take the lock NAME and print its lease (one line, a secret) for a later step to extend
    /// or release, from any process; nothing is released when fredlock exits.
    Acquire(lease::AcquireArgs),
    /// Extend the lock of a lease by --ttl from now, and print the new lease.
    Extend(lease::ExtendArgs),
    /// Release the lock of a lease.
    Release(lease::ReleaseArgs),
}

#[derive(Args, Debug)]
struct LockArgs {
    /// Lock TTL; the lock is extended while CMD runs (e.g. 30s, 1m30s, 500ms).
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
    /// Owner label stored with the lock, shown by `inspect` (and for `leader`, by `observe`)
    /// (default: host:pid).
    #[arg(long, env = "FREDLOCK_LABEL")]
    label: Option<String>,
    /// After SIGTERM, how long CMD has to exit before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = duration::parse)]
    kill_after: Duration,
    /// Exit 69 when no quorum of nodes has answered for this long while waiting (nodes down,
    /// refusing connections or credentials), counted from the start: the connect wait (up to
    /// 2s) is part of it. The causes are printed at once.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    no_quorum_timeout: Duration,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Wait at most this long for the lock (default: without a limit).
    #[arg(long, value_parser = duration::parse, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// One attempt: if the lock is held, exit at once with the conflict code.
    #[arg(long)]
    no_wait: bool,
    /// Keep the lock at least this long after acquiring it, even when CMD finishes sooner
    /// (cron de-duplication: replicas firing the same job a little later find it held). At
    /// most --ttl (a longer one is refused with exit 64: give --ttl at least this long).
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    hold_at_least: Option<Duration>,
    /// Exit code when the lock is held by someone else.
    #[arg(long, default_value_t = exit::CONFLICT, value_parser = clap::value_parser!(i32).range(0..=255))]
    conflict_exit_code: i32,
    /// The lock's name.
    name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

#[derive(Args, Debug)]
struct LeaderArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// The campaign value every observer sees while this process leads (e.g. its address).
    #[arg(long, default_value = "")]
    value: String,
    /// A higher priority takes over from a lower leader (rolling deploys); equal never does.
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// The election's name.
    name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

#[derive(Args, Debug)]
struct ObserveArgs {
    /// The election's name.
    name: String,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The lock's name.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BreakArgs {
    /// The lock's name.
    name: String,
    /// Really break it (a live holder keeps working until it notices: a `fredlock run` holder
    /// within about a second, a library holder at its next extension).
    #[arg(long)]
    yes: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct HealthArgs {
    /// Print one JSON object (fields: docs/operations.md). A node's "answered" is true when it
    /// answered with the error (up but unusable, e.g. NOPERM), false when it did not answer.
    #[arg(long)]
    json: bool,
    /// Per-node bound on each check.
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    timeout: Duration,
    /// Accept the warning ID (as `id` in --json; e.g. no-persistence for nodes run in memory
    /// on purpose): it is shown as a note and does not make the check fail. Repeatable.
    #[arg(long = "allow", value_name = "ID", value_parser = health::allowable)]
    allow: Vec<String>,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // One thread: CMD is spawned from it, so that Linux's parent-death signal (tied to the
    // spawning thread) fires only when fredlock itself exits.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fredlock: cannot start the async runtime: {e}");
            std::process::exit(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    std::process::exit(code);
}

async fn dispatch(cli: Cli) -> i32 {
    let Cli { common, command } = cli;
    match command {
        Command::Run(args) => cmd_run(&common, args).await,
        Command::Leader(args) => cmd_leader(&common, args).await,
        Command::Observe(args) => cmd_observe(&common, args).await,
        Command::Inspect(args) => cmd_inspect(&common, args).await,
        Command::Break(args) => cmd_break(&common, args).await,
        Command::Health(args) => {
            let Some(urls) = node_urls(&common) else {
                return exit::USAGE;
            };
            health::health(
                &urls,
                &common.prefix,
                args.timeout,
                args.json,
                &args.allow,
                common.confirm_replicas.map(|n| (n, common.confirm_fsync)),
            )
            .await
        }
        Command::Acquire(args) => lease::acquire(&common, args).await,
        Command::Extend(args) => lease::extend(&common, args).await,
        Command::Release(args) => lease::release(&common, args).await,
    }
}

/// `fredlock run`: the options from the arguments, a Redlock, CMD under the lock.
async fn cmd_run(common: &Common, args: RunArgs) -> i32 {
    let wait = if args.no_wait {
        Duration::ZERO
    } else {
        args.wait.unwrap_or(Duration::MAX)
    };
    let connecting_since = tokio::time::Instant::now();
    if let Some(at_least) = args.hold_at_least.filter(|&a| a > args.lock.ttl) {
        // As the library's InvalidInput::HoldLongerThanTtl: the TTL is never raised behind the
        // user's back (it is also how long a crashed fredlock keeps everyone else out).
        eprintln!(
            "fredlock: --hold-at-least {} is longer than --ttl {}: the lock would expire with its TTL, before the minimum; give --ttl {} or more",
            duration::show(at_least),
            duration::show(args.lock.ttl),
            duration::show(at_least)
        );
        return exit::USAGE;
    }
    let redlock = match connect(common, args.lock.label.as_deref()).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let options = run::RunOptions {
        name: args.name,
        ttl: args.lock.ttl,
        wait,
        hold_at_least: args.hold_at_least,
        kill_after: args.lock.kill_after,
        no_quorum: args.lock.no_quorum_timeout,
        connecting_since,
        conflict: args.conflict_exit_code,
        cmd: args.cmd,
    };
    let code = run::run(&redlock, options).await;
    redlock.close().await;
    code
}

/// `fredlock leader`: the options from the arguments, a Redlock, CMD while elected.
async fn cmd_leader(common: &Common, args: LeaderArgs) -> i32 {
    let connecting_since = tokio::time::Instant::now();
    let redlock = match connect(common, args.lock.label.as_deref()).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let options = elect::LeaderOptions {
        name: args.name,
        ttl: args.lock.ttl,
        kill_after: args.lock.kill_after,
        value: args.value,
        priority: args.priority,
        no_quorum: args.lock.no_quorum_timeout,
        connecting_since,
        cmd: args.cmd,
    };
    let code = elect::leader(&redlock, options).await;
    redlock.close().await;
    code
}

async fn cmd_observe(common: &Common, args: ObserveArgs) -> i32 {
    let redlock = match connect(common, None).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let code = elect::observe(&redlock, &args.name).await;
    redlock.close().await;
    code
}

async fn cmd_inspect(common: &Common, args: InspectArgs) -> i32 {
    let redlock = match connect(common, None).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let code = show::inspect(&redlock, &args.name, args.json).await;
    redlock.close().await;
    code
}

/// `fredlock break`: only with `--yes`.
async fn cmd_break(common: &Common, args: BreakArgs) -> i32 {
    if !args.yes {
        eprintln!(
            "fredlock: not breaking {:?} without --yes: its holder may still be working, and \
             breaking lets another process in at the same time. See who holds it with \
             `fredlock inspect {}`, then run `fredlock break {} --yes`.",
            args.name, args.name, args.name
        );
        return exit::USAGE;
    }
    let redlock = match connect(common, None).await {
        Ok(redlock) => redlock,
        Err(code) => return code,
    };
    let code = show::force_break(&redlock, &args.name, args.json).await;
    redlock.close().await;
    code
}
