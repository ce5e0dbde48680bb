//! The kinds of fault a run can inject, by row of the fault matrix, and the two sets a run picks
//! from (plain nodes, cluster nodes).
//!
//! Owns the names and the rows of the faults. Must not say when or where a fault happens (that
//! is `schedule.rs`) nor how it is applied (`faults.rs`, `cluster_faults.rs`): this file is the
//! vocabulary the configuration, the schedule and the report share, and imports none of them.

/// The faults of the schedule, by fault-matrix row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Row 2: kill -9 a minority, restart it (empty) only after the max TTL + margin.
    KillMinority,
    /// Row 2 (network form): every client cut from a minority (blackhole, reset, pass).
    PartitionMinority,
    /// Row 3: every client cut from a majority; no grant may happen meanwhile.
    PartitionMajority,
    /// Row 3: kill -9 a majority, delayed restart; no grant may happen meanwhile.
    KillMajority,
    /// Row 4: SIGSTOP a minority, then SIGCONT.
    PauseMinority,
    /// Row 5: SIGSTOP a majority for longer than the max TTL; no grant meanwhile.
    PauseMajority,
    /// Row 6: one client's proxies hold replies for longer than the max TTL, then deliver.
    HoldReplies,
    /// Row 7: 0.3-1.1 x TTL of reply latency on some nodes for some clients.
    Latency,
    /// Row 8: requests delivered, replies dropped; then reset, then pass.
    DropReplies,
    /// Row 9: connections reset (mid-command) for a while.
    Reset,
    /// Row 15: SCRIPT FLUSH on a node (restarts are row 2's delayed restarts).
    ScriptFlush,
    /// Row 2 on cluster nodes: kill -9 ONE shard of each of a minority of nodes, restart it
    /// (empty, with its slots) only after the max TTL + margin. The node's other shards go on
    /// serving their slots.
    ShardKill,
    /// Row 4 on cluster nodes: SIGSTOP one shard of each of a minority of nodes, then SIGCONT.
    ShardPause,
    /// Row 9 on cluster nodes (no proxy can sit in front of a cluster): `CLIENT KILL TYPE normal`
    /// on one shard of some nodes, repeated for a while: every client's connections to that
    /// shard reset, mid-command or idle.
    ShardConnKill,
    /// Cluster nodes only: the hash slot of a contended resource's keys migrates to another shard
    /// on some nodes: begun (`IMPORTING`/`MIGRATING`), some of its keys moved, held half-way
    /// (`ASK` redirects), then finished (`MOVED`).
    SlotMigration,
}

impl FaultKind {
    /// Every fault of a run on plain nodes (each behind every client's proxies).
    pub const ALL: [FaultKind; 11] = [
        FaultKind::KillMinority,
        FaultKind::PartitionMinority,
        FaultKind::PartitionMajority,
        FaultKind::KillMajority,
        FaultKind::PauseMinority,
        FaultKind::PauseMajority,
        FaultKind::HoldReplies,
        FaultKind::Latency,
        FaultKind::DropReplies,
        FaultKind::Reset,
        FaultKind::ScriptFlush,
    ];

    /// Every fault of a run on cluster nodes
    /// ([`TortureConfig::cluster_shards`](super::TortureConfig::cluster_shards)). A node fault
    /// of the plain kinds hits every shard of the node. There is no proxy in front of a cluster
    /// (its redirects name the shards' real addresses), so the per-client network faults are
    /// replaced by [`ShardConnKill`](Self::ShardConnKill); and a majority is never killed (a
    /// client could take a foreign-held resource on restarted nodes before the foreign owner
    /// planted its keys again, which the proxies prevent on plain nodes).
    pub const CLUSTER: [FaultKind; 8] = [
        FaultKind::KillMinority,
        FaultKind::PauseMinority,
        FaultKind::PauseMajority,
        FaultKind::ScriptFlush,
        FaultKind::ShardKill,
        FaultKind::ShardPause,
        FaultKind::ShardConnKill,
        FaultKind::SlotMigration,
    ];

    /// The fault-matrix row (empty for a slot migration, which is no row of the matrix: a
    /// cluster moving a slot is not a fault of the node).
    pub fn row(self) -> &'static str {
        match self {
            FaultKind::KillMinority | FaultKind::PartitionMinority => "2",
            FaultKind::PartitionMajority | FaultKind::KillMajority => "3",
            FaultKind::PauseMinority => "4",
            FaultKind::PauseMajority => "5",
            FaultKind::HoldReplies => "6",
            FaultKind::Latency => "7",
            FaultKind::DropReplies => "8",
            FaultKind::Reset => "9",
            FaultKind::ScriptFlush => "15",
            FaultKind::ShardKill => "2",
            FaultKind::ShardPause => "4",
            FaultKind::ShardConnKill => "9",
            FaultKind::SlotMigration => "",
        }
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            FaultKind::KillMinority => "kill -9 minority, delayed restart",
            FaultKind::PartitionMinority => "partition minority (all clients)",
            FaultKind::PartitionMajority => "partition majority (all clients)",
            FaultKind::KillMajority => "kill -9 majority, delayed restart",
            FaultKind::PauseMinority => "SIGSTOP minority",
            FaultKind::PauseMajority => "SIGSTOP majority > max TTL",
            FaultKind::HoldReplies => "hold replies > max TTL (1 client)",
            FaultKind::Latency => "latency 0.3-1.1 x TTL",
            FaultKind::DropReplies => "drop replies, then reset",
            FaultKind::Reset => "TCP reset mid-command",
            FaultKind::ScriptFlush => "SCRIPT FLUSH",
            FaultKind::ShardKill => "kill -9 one shard of a minority, delayed restart",
            FaultKind::ShardPause => "SIGSTOP one shard of a minority",
            FaultKind::ShardConnKill => "CLIENT KILL on one shard (all clients)",
            FaultKind::SlotMigration => "slot migration held half-way (ASK, then MOVED)",
        }
    }
}
