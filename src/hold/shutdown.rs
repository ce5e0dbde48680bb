//! Graceful shutdown: [`Redlock::close`] on a signal, so that a process stopped by its
//! supervisor (a rolling deploy's `SIGTERM`, a Ctrl-C) releases what it holds and the next
//! waiter in another process gets the lock at once, instead of after the keys' TTL.
//!
//! The trap this covers: a process that never listens for `SIGTERM` is killed by it, with no
//! destructor run, so every key it holds stays for its TTL. One that listens (tokio's
//! `signal(SignalKind::terminate())` or `ctrl_c()`, anywhere in the process) is no longer
//! killed by it at all: the default action is replaced for good, and unless the listener ends
//! the process the signal is swallowed. [`Redlock::close_on_terminate`] listens, closes every
//! `Redlock` that asked, then ends the process with the conventional status (`128 + signal`).
//!
//! Owns: the signal listener, the process-wide list of Redlocks to close on it, [`Shutdown`].
//! Must not: release anything itself ([`Redlock::close`] does).

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use crate::rounds::redlock::{Inner, Redlock};

/// A shutdown armed by [`Redlock::shutdown_on`] or [`Redlock::close_on_terminate`]: tells when
/// the `Redlock`'s [`close`](Redlock::close) has finished. Cheap to clone.
///
/// Dropping it does not disarm the shutdown: the signal is still waited for, in a task that
/// holds the `Redlock` weakly (a `Redlock` dropped meanwhile is not kept alive by it).
#[derive(Debug, Clone)]
pub struct Shutdown {
    done: watch::Receiver<bool>,
}

impl Shutdown {
    /// Resolves once the signal came and [`Redlock::close`] has finished: every lock, permit
    /// and term released, the connections closed. Await it before `main` returns, so that the
    /// runtime is not shut down under the releases.
    ///
    /// Cancellation: safe at any point; it only observes.
    pub async fn closed(&self) {
        let mut done = self.done.clone();
        // An error means the task ended without closing: its Redlock was dropped (nothing is
        // held any more) or the runtime shut down; either way there is nothing left to wait for.
        let _ = done.wait_for(|closed| *closed).await;
    }

    /// Whether the signal came and [`Redlock::close`] has finished.
    pub fn is_closed(&self) -> bool {
        *self.done.borrow()
    }
}

/// Closes `inner`'s Redlock (if it still exists) once `signal` resolves, then says so.
async fn close_after(inner: Weak<Inner>, signal: impl Future, done: watch::Sender<bool>) {
    signal.await;
    if let Some(inner) = inner.upgrade() {
        Redlock { inner }.close().await;
    }
    done.send_replace(true);
}

impl Redlock {
    /// Closes this `Redlock` ([`close`](Self::close): releases every lock, permit and term it
    /// holds, ends its waiting acquires and cancels [`with_lock`](Self::with_lock) work) as soon
    /// as `signal` resolves, for a service that already has a shutdown signal of its own (the one
    /// it gives its HTTP server's graceful shutdown, a `CancellationToken`'s `cancelled()`).
    /// Returns at once; await [`Shutdown::closed`] before the process exits.
    ///
    /// This does not end the process: that is the caller's shutdown sequence. For a service
    /// with none, [`close_on_terminate`](Self::close_on_terminate) listens for `SIGTERM` and
    /// Ctrl-C and exits afterwards.
    ///
    /// Must be called inside a tokio runtime (it spawns the task that waits for `signal`), as
    /// [`Lock::keep_alive`](crate::Lock::keep_alive).
    pub fn shutdown_on<F>(&self, signal: F) -> Shutdown
    where
        F: Future + Send + 'static,
    {
        let (tx, done) = watch::channel(false);
        tokio::spawn(close_after(Arc::downgrade(&self.inner), signal, tx));
        Shutdown { done }
    }

    /// The graceful shutdown a service gets right by default: on `SIGTERM` (what Kubernetes,
    /// systemd and Docker send to stop a process) or `SIGINT` (Ctrl-C), close this `Redlock` and
    /// every other one that called this method ([`close`](Self::close): every lock, permit and
    /// term released, so the next waiter in another process is woken at once; waiting acquires
    /// end; [`with_lock`](Self::with_lock) work is cancelled), then end the process with status
    /// 143 (`SIGTERM`) or 130 (`SIGINT`), as the signal's default action would have. A second
    /// signal during the close ends the process at once.
    ///
    /// Why the exit: listening for a signal anywhere in a process replaces its default action
    /// for good, so a process that listens and does not exit would swallow its `SIGTERM`. If
    /// your service has its own shutdown sequence (it drains requests first), use
    /// [`shutdown_on`](Self::shutdown_on) with your own signal instead, or call
    /// [`close`](Self::close) at the end of that sequence.
    ///
    /// Must be called inside a tokio runtime, which must keep running until the signal: the
    /// listener is a task on it. Errors: the operating system refused to install the signal
    /// handler (the error says which).
    pub fn close_on_terminate(&self) -> std::io::Result<Shutdown> {
        let (tx, done) = watch::channel(false);
        let mut list = guard(&ON_TERMINATE);
        if list.listener.as_ref().is_none_or(|l| l.is_finished()) {
            list.listener = Some(tokio::spawn(listen(signals()?)).abort_handle());
        }
        list.redlocks.retain(|(inner, _)| inner.strong_count() > 0);
        list.redlocks.push((Arc::downgrade(&self.inner), tx));
        Ok(Shutdown { done })
    }
}

/// The Redlocks to close on `SIGTERM` or `SIGINT`, and the task that listens.
struct OnTerminate {
    redlocks: Vec<(Weak<Inner>, watch::Sender<bool>)>,
    listener: Option<tokio::task::AbortHandle>,
}

static ON_TERMINATE: Mutex<OnTerminate> = Mutex::new(OnTerminate {
    redlocks: Vec::new(),
    listener: None,
});

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The signals that stop a process, installed at once (so that an error is the caller's).
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

fn signals() -> std::io::Result<Signals> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }
    #[cfg(not(unix))]
    Ok(Signals {})
}

impl Signals {
    /// The next signal's exit status: 143 for `SIGTERM`, 130 for `SIGINT`.
    async fn next(&mut self) -> i32 {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => 128 + 15,
                _ = self.interrupt.recv() => 128 + 2,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            128 + 2
        }
    }
}

/// Waits for a signal, closes every Redlock on the list at once, then exits.
async fn listen(mut signals: Signals) {
    let status = signals.next().await;
    let redlocks = std::mem::take(&mut guard(&ON_TERMINATE).redlocks);
    tracing::info!(
        status,
        redlocks = redlocks.len(),
        "fredlock: stop signal: closing (releasing every lock held), then exiting"
    );
    let closes = redlocks.into_iter().map(|(inner, done)| async move {
        if let Some(inner) = inner.upgrade() {
            Redlock { inner }.close().await;
        }
        done.send_replace(true);
    });
    tokio::select! {
        _ = futures::future::join_all(closes) => {}
        again = signals.next() => {
            tracing::warn!("fredlock: second stop signal: exiting before close() finished");
            std::process::exit(again);
        }
    }
    std::process::exit(status);
}
