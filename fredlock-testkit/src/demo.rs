//! The machinery behind fredlock's runnable demonstrations (`make demo`, `make scheduler`): the
//! nodes, the worker processes, the header, the timeline and the verdict.
//!
//! The examples keep only what a user would copy: the code that takes the lock or leads. Each
//! calls one `main` here ([`critical_section::main`], [`scheduler::main`]) with that code; the
//! same program then runs either as the parent (no arguments) or as one of the workers the
//! parent starts (`--worker ID`). This module holds what both demonstrations share:
//!
//! * [`nodes`]: the nodes named by `FREDLOCK_NODES`, or three local `redis-server` processes
//!   started for the run (stopped when the value is dropped);
//! * [`Header`] and [`check_quorum`]: the header every demo prints about its nodes, and the early
//!   failure, with a hint, when too few of them answer;
//! * [`Workers`]: copies of the running program started with `--worker ID`, the nodes in their
//!   environment (not on the command line, where `ps` would show a password), reporting on their
//!   stdout one line at a time, each line timestamped by the parent as it arrives so that every
//!   event shares one clock; [`Workers::start`] waits until all are connected and starts them at
//!   once (a `go` line on their stdin), so that process start-up does not stagger them;
//! * [`wait_for_go`]: the worker's side of that start;
//! * [`parent`] and [`worker`]: exit codes, error messages and Ctrl-C for both sides.

pub mod critical_section;
pub mod scheduler;

use std::error::Error;
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use fredlock::{Inspection, Redlock};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines, Stdin};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::test_nodes::NODES_ENV;
use crate::{env_nodes, LocalNodes, TestNodes};

/// Any error, for the demos' plumbing.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Worker -> parent, on the worker's stdout: connected, waiting for [`GO`].
pub const READY: &str = "@ready";
/// Parent -> worker, on the worker's stdin: start now.
pub const GO: &str = "go";
/// How long the parent waits for every worker to connect.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// What to check when nodes do not answer.
const HINT: &str =
    "is Redis running there? (`docker compose up -d` starts the project's three nodes)";

/// The nodes a demo runs on: every URL in `FREDLOCK_NODES` when it is set, otherwise three local
/// `redis-server` processes, stopped when the returned value is dropped (keep it until the end).
pub async fn nodes() -> Result<TestNodes, BoxError> {
    match env_nodes() {
        Some(urls) => Ok(TestNodes::External(urls)),
        None => LocalNodes::start(3)
            .await
            .map(TestNodes::Local)
            .map_err(|e| format!("starting local redis-server nodes: {e}").into()),
    }
}

/// The nodes a worker was given by its parent (in `FREDLOCK_NODES`).
pub fn worker_nodes() -> Result<Vec<String>, BoxError> {
    env_nodes()
        .ok_or_else(|| "FREDLOCK_NODES is not set (workers are started by the parent)".into())
}

/// A demo's header: rows of a label, padded to one width, and a text.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// The labels' column width.
    pub width: usize,
}

impl Header {
    /// One row: `  label  text`.
    pub fn row(&self, label: &str, text: impl Display) {
        println!("  {label:<width$}{text}", width = self.width);
    }

    /// A continuation row: the text under the previous row's text.
    pub fn more(&self, text: impl Display) {
        self.row("", text);
    }

    /// The `nodes` rows: every node (marked when it does not answer) and where they come from.
    pub fn nodes(&self, before: &Inspection, nodes: &TestNodes) {
        let names: Vec<String> = before
            .nodes
            .iter()
            .map(|n| match n.state {
                Ok(_) => n.node.clone(),
                Err(_) => format!("{} (NOT ANSWERING)", n.node),
            })
            .collect();
        self.row("nodes", names.join("  "));
        match nodes {
            TestNodes::Local(_) => self.more(format_args!(
                "{} local redis-server processes started for this run (set {NODES_ENV} to use yours)",
                names.len()
            )),
            TestNodes::External(_) => self.more(format_args!("from {NODES_ENV}")),
        }
    }
}

/// Fails, with a hint, when fewer nodes answer than the quorum that `needs` ("a lock", "an
/// election") needs.
pub fn check_quorum(redlock: &Redlock, before: &Inspection, needs: &str) -> Result<(), BoxError> {
    let answering = before.nodes.iter().filter(|n| n.state.is_ok()).count();
    if answering < redlock.quorum() {
        return Err(format!(
            "only {answering} of {} nodes answer, fewer than the {} {needs} needs: {HINT}",
            before.nodes.len(),
            redlock.quorum()
        )
        .into());
    }
    Ok(())
}

/// Fails, with a hint, when the first node does not answer (a demo keeps its data there).
pub fn check_first_node(before: &Inspection, what: &str) -> Result<(), BoxError> {
    match before.nodes.first().filter(|n| n.state.is_err()) {
        Some(first) => {
            Err(format!("{} holds {what} but does not answer: {HINT}", first.node).into())
        }
        None => Ok(()),
    }
}

/// Runs a demo's parent process. An error is printed as `error: ...` (exit code 2). Ctrl-C makes
/// it return 130 instead of dying on the signal, so that destructors stop the local nodes and the
/// workers.
pub async fn parent(run: impl Future<Output = Result<ExitCode, BoxError>>) -> ExitCode {
    tokio::select! {
        result = run => result.unwrap_or_else(|e| {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }),
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted");
            ExitCode::from(130)
        }
    }
}

/// Runs a demo's worker process. An error is printed on stderr, which the parent passes through
/// to the user, as `worker ID: FAILED: ...` (exit code 1).
pub async fn worker(id: usize, run: impl Future<Output = Result<(), BoxError>>) -> ExitCode {
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker {id}: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The worker's side of [`Workers::start`]: says it is connected, then waits for the parent's
/// `go`. Returns the rest of stdin (more instructions may follow; it closes when the parent goes
/// away).
pub async fn wait_for_go() -> Result<Lines<BufReader<Stdin>>, BoxError> {
    println!("{READY}");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    if stdin.next_line().await?.as_deref().map(str::trim) != Some(GO) {
        return Err("the parent went away before the start".into());
    }
    Ok(stdin)
}

/// One line from a worker's stdout, or its end, stamped with when the parent read it.
#[derive(Debug)]
pub struct Line {
    /// When the parent read it: one clock for every worker.
    pub at: Instant,
    /// The worker's index among [`Workers`] (not its id).
    pub worker: usize,
    /// The line; `None` when the worker's stdout closed (it exited or was killed).
    pub text: Option<String>,
}

/// The worker processes: copies of the running program, and what their stdout says.
#[derive(Debug)]
pub struct Workers {
    ids: Vec<usize>,
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    lines: mpsc::UnboundedReceiver<Line>,
}

impl Workers {
    /// Starts one copy of this program per id, as `PROGRAM --worker ID ARGS...`, with `urls` in
    /// its `FREDLOCK_NODES`, its stdin and stdout piped, its stderr inherited. Each is killed when
    /// this value is dropped (an early return, Ctrl-C): no worker is left running.
    pub fn spawn(
        ids: impl IntoIterator<Item = usize>,
        urls: &[String],
        args: &[String],
    ) -> Result<Workers, BoxError> {
        let exe = std::env::current_exe()?;
        let (tx, lines) = mpsc::unbounded_channel();
        let (mut workers, mut children, mut stdins) = (Vec::new(), Vec::new(), Vec::new());
        for (worker, id) in ids.into_iter().enumerate() {
            let mut child = Command::new(&exe)
                .arg("--worker")
                .arg(id.to_string())
                .args(args)
                .env(NODES_ENV, urls.join(","))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()?;
            stdins.push(child.stdin.take());
            let stdout = child.stdout.take().ok_or("worker stdout not captured")?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // The timestamp is taken here, as the line arrives.
                    let at = Instant::now();
                    let _ = tx.send(Line {
                        at,
                        worker,
                        text: Some(line),
                    });
                }
                let at = Instant::now();
                let _ = tx.send(Line {
                    at,
                    worker,
                    text: None,
                });
            });
            workers.push(id);
            children.push(child);
        }
        Ok(Workers {
            ids: workers,
            children,
            stdins,
            lines,
        })
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// The id of worker `w` (its index).
    pub fn id(&self, w: usize) -> usize {
        self.ids[w]
    }

    /// Waits until every worker has said it is connected, then tells them all to start at once;
    /// returns that moment. Other lines meanwhile are printed as `  [worker ID] line`.
    pub async fn start(&mut self) -> Result<Instant, BoxError> {
        let limit = Instant::now() + CONNECT_LIMIT;
        let mut ready = 0;
        while ready < self.len() {
            match tokio::time::timeout_at(limit, self.lines.recv()).await {
                Ok(Some(line)) => match line.text.as_deref() {
                    Some(READY) => ready += 1,
                    Some(other) => println!("  [worker {}] {other}", self.id(line.worker)),
                    None => {
                        let id = self.id(line.worker);
                        return Err(format!("worker {id} exited before the start").into());
                    }
                },
                Ok(None) => return Err("every worker went away".into()),
                Err(_) => {
                    let secs = CONNECT_LIMIT.as_secs();
                    return Err(format!("workers not connected after {secs} s").into());
                }
            }
        }
        let started = Instant::now();
        for stdin in self.stdins.iter_mut().flatten() {
            stdin.write_all(format!("{GO}\n").as_bytes()).await?;
        }
        Ok(started)
    }

    /// The next line from any worker; `None` once every worker's stdout has closed. Cancel-safe.
    pub async fn next(&mut self) -> Option<Line> {
        self.lines.recv().await
    }

    /// Sends `line` to worker `w`'s stdin, then closes it. A worker that is gone already is not an
    /// error: the end of its stdout tells the rest.
    pub async fn tell_and_close(&mut self, w: usize, line: &str) {
        if let Some(mut stdin) = self.stdins[w].take() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
        }
    }

    /// Kills worker `w` with SIGKILL (tokio's `start_kill`): no signal handler, no destructor runs
    /// in it. Its last lines and the end of its stdout still come through [`Workers::next`].
    pub fn kill(&mut self, w: usize) -> io::Result<()> {
        self.children[w].start_kill()
    }

    /// Waits for worker `w` to exit, for `limit` at most; then kills it and waits for that.
    pub async fn wait(&mut self, w: usize, limit: Duration) -> io::Result<ExitStatus> {
        let child = &mut self.children[w];
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = child.start_kill();
                child.wait().await
            }
        }
    }
}
