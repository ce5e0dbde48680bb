//! Leader election for a scheduler, across PROCESSES: one leader at a time, and a quick but safe
//! takeover when the leader crashes.
//!
//! Three scheduler processes campaign in the same election (`Redlock::elect`). Only the leader
//! runs the nightly job, once a second, and only while `Election::is_leader()` says so: that
//! checks the term's validity on the clock, not just the last role the process heard of. A job
//! in progress is cancelled the moment leadership is lost.
//!
//! The demo lets a leader run a few jobs, then kills it with SIGKILL: a crash, so it never
//! resigns and its lock stays on the nodes until its TTL runs out. Nobody can take over before
//! that (that is the safety); a follower takes over right after (that is the liveness). The new
//! leader runs a few jobs, then everyone resigns. The demo prints a timeline, the failover gap,
//! and checks that there was never more than one leader at a time.
//!
//! ```text
//! cargo run --example scheduler
//! FREDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example scheduler
//! ```
//!
//! The part to copy is [`worker`], [`lead`] and the settings above them; the `say(..)` calls
//! report to the demo (a service would log instead). Starting the nodes and the processes,
//! killing the leader, the timeline and the verdict are test machinery in
//! `fredlock_testkit::demo::scheduler`. Nodes: the URLs in `FREDLOCK_NODES` when set; otherwise
//! three local `redis-server` processes started for the run and stopped at the end.

use std::process::ExitCode;
use std::time::Duration;

use fredlock::{ElectOptions, Election, Observer, Redlock, Retry, Role, Term};
use fredlock_testkit::demo::scheduler::{self as demo, say, Demo, Msg, Quit, Worker};
use fredlock_testkit::demo::BoxError;
use tokio::sync::watch;
use tokio::time::Instant;

/// The election every scheduler process takes part in.
const RESOURCE: &str = "scheduler:nightly";
/// TTL of the leader's lock. The leader extends it while it leads (when a third is left); if it
/// crashes, the lock expires at most one TTL after its last extension. That bounds how long
/// the scheduler goes without a leader after a crash, and how long a frozen leader may be
/// trusted: shorter means faster takeover, but more extension traffic.
const TTL: Duration = Duration::from_secs(1);
/// How followers campaign: one attempt, then a pause of `delay` plus up to `jitter`, again and
/// again until they win or resign. (`elect` campaigns for as long as the election lives: it uses
/// the pause, not `attempts`, which only bounds `Redlock::acquire`.)
const RETRY: Retry = Retry {
    attempts: 1,
    delay: Duration::from_millis(50),
    jitter: Duration::from_millis(50),
};
/// The leader starts a job this often...
const JOB_EVERY: Duration = Duration::from_secs(1);
/// ...and each job takes this long (a sleep, standing in for the real work).
const JOB_WORK: Duration = Duration::from_millis(400);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Without arguments: the parent (the testkit), which starts three copies of this program
    // that each run `worker`.
    let demo = Demo {
        resource: RESOURCE,
        ttl: TTL,
        retry: RETRY,
        job_every: JOB_EVERY,
        job_work: JOB_WORK,
    };
    demo::main(demo, worker).await
}

/// One scheduler process: campaign, lead while elected, campaign again; resign when asked.
async fn worker(w: Worker) -> Result<(), BoxError> {
    let redlock = Redlock::builder()
        .nodes(w.nodes.clone())
        .retry(RETRY)
        .build()
        .await?;
    // Connected; every process campaigns from the same moment. `quit`: asked to resign.
    let mut quit: Quit = w.wait_for_start().await?;

    // Campaign in the background from now until resign (or drop), with this process's address
    // as the campaign value: every process can read it (`leader_of`, `observe`), so followers
    // know where the leader is. (A stand-in here: each worker would serve HTTP on its port.)
    let address = format!("127.0.0.1:{}", 9100 + w.id);
    let options = ElectOptions::default().value(address.clone());
    let election = redlock.elect_with_options(RESOURCE, TTL, options)?;
    // Followers forward requests to the leader: an observer tells them where it is, pushed on
    // every change (and `None` while there is no leader: then requests wait or fail).
    let observer = redlock.observe(RESOURCE).await?;
    tokio::spawn(forward_to_leader(observer, address));
    loop {
        // Follower: wait until we win (or are asked to quit).
        let term = tokio::select! {
            biased;
            () = quit.requested() => break,
            term = election.leader() => term,
        };
        say(Msg::Leader {
            // The fingerprint, never the token (a secret: whoever has it can release the lock).
            token: term.fingerprint(),
            valid: left(term.valid_until),
        });
        let stop = lead(&election, &term, &mut quit).await;
        // Whatever the reason, we stop acting as leader NOW, before anything else happens (on
        // quit, before the release lets another process win).
        say(Msg::Follower);
        if stop == Stop::Quit {
            break;
        }
    }
    // Stops campaigning and, if we still hold the lock, releases it (awaited), so that the next
    // leader does not have to wait for a TTL.
    election.resign().await;
    say(Msg::Resigned);
    redlock.close().await;
    Ok(())
}

/// A follower's request routing: whenever the leader changes, say where requests go now. A real
/// service would keep `observer.current()` at hand and send each request to `leader.value`,
/// with the term number so that the leader can refuse a request meant for an older term.
async fn forward_to_leader(observer: Observer, own: String) {
    let mut leader = observer.watch();
    loop {
        let line = match &*leader.borrow_and_update() {
            Some(l) if l.value == own => None,
            Some(l) => Some(format!(
                "follower: forwarding requests to the leader at {} (term {})",
                l.value, l.term
            )),
            None => Some("follower: no leader right now; holding requests".to_string()),
        };
        if let Some(line) = line {
            println!("{line}");
        }
        if leader.changed().await.is_err() {
            return;
        }
    }
}

/// Why a worker stopped leading.
#[derive(Debug, PartialEq)]
enum Stop {
    /// Leadership lost (the lock could not be extended in time): campaign again.
    Lost,
    /// Asked to resign.
    Quit,
}

/// Leads one term: a job every `JOB_EVERY`, only while this term is valid. Returns as soon as the
/// term ends (even in the middle of a job), or between jobs when asked to quit.
async fn lead(election: &Election, term: &Term, quit: &mut Quit) -> Stop {
    let number = term.number();
    let fingerprint = term.fingerprint();
    let mut role = election.watch();
    // The validity the demo knows of (sent with `Msg::Leader`); each extension moves it.
    let mut reported = term.valid_until;
    let mut next_job = Instant::now();
    for n in 1.. {
        // Idle until the next job is due.
        tokio::select! {
            biased;
            () = term_ended(&mut role, number, &mut reported) => return Stop::Lost,
            () = quit.requested() => return Stop::Quit,
            () = tokio::time::sleep_until(next_job) => {}
        }
        // Right before acting, ask again, on the clock: `is_leader()` is false once the term's
        // validity has passed, even if no one told us yet that it was lost.
        if !leading(election, number) {
            return Stop::Lost;
        }
        say(Msg::Job {
            n,
            token: fingerprint[..8].to_string(),
        });
        // The job, cancelled at once (at its next `.await`) if the term ends. A quit request
        // lets it finish: resigning is graceful.
        tokio::select! {
            biased;
            () = term_ended(&mut role, number, &mut reported) => {
                say(Msg::Aborted(n));
                return Stop::Lost;
            }
            () = nightly_job() => say(Msg::Done(n)),
        }
        next_job += JOB_EVERY;
    }
    unreachable!("jobs are numbered until u64::MAX")
}

/// The work itself. A real job should also check `leading()` before each side effect, or better,
/// pass the term number (`term.number()`, the term's fencing token) along with every write, for
/// the system it writes to to check: a process that freezes (GC, SIGSTOP) between a check and a
/// write could otherwise write late.
async fn nightly_job() {
    tokio::time::sleep(JOB_WORK).await;
}

/// Whether the term with this number is ours right now, within its validity.
fn leading(election: &Election, number: u64) -> bool {
    let role = election.role();
    // `Role::is_leader` (like `Election::is_leader`) checks the clock against the validity.
    role.is_leader() && role.term().is_some_and(|t| t.number() == number)
}

/// Resolves when the term with this number ends: the role turns Follower (or a new term), or the
/// term's validity passes before an extension arrives. Reports each extension to the demo
/// (`reported`: the validity it knows of). Cancellation: safe (it only observes).
async fn term_ended(role: &mut watch::Receiver<Role>, number: u64, reported: &mut Instant) {
    loop {
        let valid_until = {
            let r = role.borrow_and_update();
            match r.term() {
                Some(t) if t.number() == number && r.is_leader() => t.valid_until,
                _ => return,
            }
        };
        if valid_until != *reported {
            *reported = valid_until;
            say(Msg::Valid(left(valid_until)));
        }
        tokio::select! {
            () = tokio::time::sleep_until(valid_until) => {}
            changed = role.changed() => {
                if changed.is_err() {
                    return; // the campaign ended
                }
            }
        }
    }
}

/// Validity left before `until`, as this process sees it now.
fn left(until: Instant) -> Duration {
    until.saturating_duration_since(Instant::now())
}
