//! The semaphores and fenced resources every client of a run uses, and the keys of the fenced
//! registers on the data node.
//!
//! Owns these names, which the clients (`worker/`) and the set-up and checks around a run
//! (`env.rs`) share. Must not run anything: a name is all it gives.

/// The run's semaphores: name and permits. Every client uses the same ones.
pub(super) const SEMAPHORES: [(&str, usize); 2] = [("sem:0", 2), ("sem:1", 3)];
/// Resources taken with fencing tokens (fencing mode only).
pub(super) const FENCED_RESOURCES: usize = 3;

/// The register's key and its log's key for a fenced resource.
pub(super) fn register_keys(resource: &str) -> (String, String) {
    (
        format!("fenced-register:{resource}"),
        format!("fenced-register:{resource}:log"),
    )
}

/// The name of fenced resource `i`.
pub(super) fn fenced_resource(i: usize) -> String {
    format!("fenced:{}", i % FENCED_RESOURCES)
}
