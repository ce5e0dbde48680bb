//! The Lua scripts of the semaphore and of the read-write lock (files in `lua/`, each with its
//! KEYS/ARGV contract and reply): taking a semaphore slot (`sem_take!`, shared with the
//! semaphore's gate script in `scripts`) and a read-write lock's read share, write lock,
//! downgrade and view.
//!
//! Owns: those script bodies. Must not: hash or send them (`scripts` registers them, the node
//! layer sends them).

/// `lua/sem_take.lua`: `take()`: take one semaphore slot, the first free one in the order given
/// (the same order is sent to every node, so in the common case every node picks the same
/// slot).
macro_rules! sem_take {
    () => {
        include_str!("lua/sem_take.lua")
    };
}
pub(crate) use sem_take;

/// Take one semaphore slot (see `sem_take!`): reply `{1, position, counter}`, `{0}` or
/// `{-1, permits}`.
pub(crate) const SEM_ACQUIRE: &str = concat!(sem_take!(), "return take()\n");

/// `lua/rw_read.lua`: Read-write lock, take a read share.
pub(crate) const RW_READ: &str = include_str!("lua/rw_read.lua");

/// `lua/rw_write.lua`: Read-write lock, take the write lock: only when no writer holds it and
/// no reader key of the set still exists.
pub(crate) const RW_WRITE: &str = include_str!("lua/rw_write.lua");

/// `lua/rw_downgrade.lua`: Read-write lock, downgrade: the writer becomes a reader without a
/// gap, in one step per node: only where the writer key still holds the writer's value, a
/// reader key is set and listed and the writer key deleted.
pub(crate) const RW_DOWNGRADE: &str = include_str!("lua/rw_downgrade.lua");

/// `lua/rw_view.lua`: Read-write lock, inspect: the writer, the waiting writer's mark and every
/// live reader.
pub(crate) const RW_VIEW: &str = include_str!("lua/rw_view.lua");
