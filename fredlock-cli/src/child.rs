//! CMD as a child process: started with the terminal's stdio, signalled, stopped with a grace
//! period, and its status turned into an exit code. Also the signals fredlock itself receives.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit;

/// A running CMD.
pub struct Child {
    child: tokio::process::Child,
    pid: Option<i32>,
    /// Set once it exited (so that it is never signalled after its pid may have been reused).
    status: Option<ExitStatus>,
}

/// Starts `cmd` (program and arguments) with fredlock's stdin, stdout and stderr. On Linux the
/// child is killed (SIGKILL) if fredlock dies first, since the lock it ran under is then no
/// longer kept alive. Errors are exit codes, as a shell gives them: 127 not found, 126 not
/// executable.
pub fn spawn(cmd: &[OsString]) -> Result<Child, i32> {
    spawn_with_env(cmd, &[])
}

/// [`spawn`] with extra environment variables for CMD.
pub fn spawn_with_env(cmd: &[OsString], env: &[(&str, String)]) -> Result<Child, i32> {
    let Some((program, args)) = cmd.split_first() else {
        eprintln!("fredlock: no command given after --");
        return Err(exit::USAGE);
    };
    let mut command = tokio::process::Command::new(program);
    command.args(args).kill_on_drop(false);
    for (k, v) in env {
        command.env(k, v);
    }
    die_with_parent(&mut command);
    match command.spawn() {
        Ok(child) => {
            let pid = child.id().and_then(|p| i32::try_from(p).ok());
            Ok(Child {
                child,
                pid,
                status: None,
            })
        }
        Err(e) => {
            let shown = program.to_string_lossy();
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                std::io::ErrorKind::PermissionDenied => exit::NOT_EXECUTABLE,
                _ => exit::NOT_EXECUTABLE,
            };
            eprintln!("fredlock: cannot run {shown:?}: {e}");
            Err(code)
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls are made (prctl, getppid).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // fredlock died between fork and prctl: do not run without it.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("fredlock exited before CMD started"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut tokio::process::Command) {}

impl Child {
    /// Waits for the child to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let status = match self.child.wait().await {
            Ok(status) => status,
            Err(e) => {
                eprintln!("fredlock: lost track of CMD: {e}");
                std::os::unix::process::ExitStatusExt::from_raw(exit::SOFTWARE << 8)
            }
        };
        self.status = Some(status);
        status
    }

    /// Sends `sig` to the child, unless it already exited.
    pub fn signal(&mut self, sig: i32) {
        if self.status.is_some() || matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Some(pid) = self.pid {
            send(pid, sig);
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`; returns its status.
    pub async fn stop(&mut self, grace: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            return status;
        }
        eprintln!(
            "fredlock: CMD still running {} after SIGTERM; sending SIGKILL",
            crate::duration::show(grace)
        );
        self.signal(libc::SIGKILL);
        self.wait().await
    }
}

#[allow(unsafe_code)]
fn send(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            eprintln!("fredlock: cannot signal CMD (pid {pid}): {e}");
        }
    }
}

/// The exit code a shell would show for `status`: the code, or 128 + the signal.
pub fn code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => exit::SOFTWARE,
    }
}

/// The signals fredlock acts on: SIGINT, SIGTERM, SIGHUP, SIGQUIT.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    /// Installs the handlers (from now on these signals no longer kill fredlock).
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }
}

/// Whether fredlock should pass `sig` on to CMD. CMD runs in fredlock's process group, so a
/// terminal's Ctrl-C (SIGINT) or Ctrl-\ (SIGQUIT) already reached it when fredlock is in the
/// terminal's foreground group: sending it again would deliver it twice. Everything else (a
/// `kill` from a supervisor, SIGTERM, SIGHUP) is forwarded.
pub fn should_forward(sig: i32) -> bool {
    !((sig == libc::SIGINT || sig == libc::SIGQUIT) && in_terminal_foreground())
}

#[allow(unsafe_code)]
fn in_terminal_foreground() -> bool {
    // SAFETY: plain queries on our own file descriptors and process group.
    unsafe {
        let group = libc::getpgrp();
        (0..=2).any(|fd| libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == group)
    }
}
