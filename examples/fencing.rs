//! Why fencing tokens: a holder that pauses past its deadline (GC, SIGSTOP, a swapped VM) still
//! believes it holds the lock when it wakes. The protected resource must check a token that
//! grows with every holder, and reject writes with an older one.
//!
//! ```text
//! make fencing
//! ```
//!
//! The protected resource here is a Redis key updated by a small script that remembers the
//! highest token it has seen (any store with a compare-and-set works the same way).

use std::time::Duration;

use fredlock::fred::prelude::{ClientLike, KeysInterface, LuaInterface};
use fredlock::Redlock;
use fredlock_testkit::LocalNodes;

/// Write ARGV[1] to KEYS[1] only if the token ARGV[2] is above the highest seen (in KEYS[2]).
const FENCED_WRITE: &str = r#"
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 1
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = LocalNodes::start(3).await?; // three local redis-server processes
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .fencing_tokens(true)
        .build()
        .await?;
    // The protected resource: a key on a separate data store (here node 0, for brevity).
    let store = redlock.client(0).ok_or("no node 0")?.clone();
    let write = |token: u64, value: &'static str| {
        let store = store.clone();
        async move {
            let keys = vec!["account:42", "account:42:fence"];
            let args = vec![value.to_string(), token.to_string()];
            let ok: i64 = store.eval(FENCED_WRITE, keys, args).await?;
            Ok::<bool, fredlock::fred::error::Error>(ok == 1)
        }
    };

    let a = redlock
        .acquire("account:42", Duration::from_millis(300))
        .await?;
    let token_a = a.fencing_token().ok_or("fencing is on")?;
    println!("A holds the lock with token {token_a}, then pauses (a long GC)...");
    tokio::time::sleep_until(a.deadline() + Duration::from_millis(100)).await;

    let b = redlock
        .acquire("account:42", Duration::from_secs(10))
        .await?;
    let token_b = b.fencing_token().ok_or("fencing is on")?;
    println!("A's lock expired; B holds it with token {token_b}");
    println!(
        "B writes:        accepted = {}",
        write(token_b, "balance=100 (B)").await?
    );
    println!(
        "A wakes, writes: accepted = {}  <- rejected: token {token_a} < {token_b}",
        write(token_a, "balance=0 (A)").await?
    );
    let value: Option<String> = store.get("account:42").await?;
    println!("account:42 = {}", value.unwrap_or_default());
    drop(a);
    b.release().await?;
    let _ = store.quit().await;
    Ok(())
}
