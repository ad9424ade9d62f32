// Package bench holds meshbox's benchmarks. Each measures a part of meshbox
// against a raw baseline in the same process and the same run (raw
// amqp091-go, raw NATS, raw pgx, raw bbolt), on services the harness in
// testing/meshtest starts, and prints one line per comparison, such as
//
//	BENCH <name> ours=<value> baseline=<value> ratio=<ours/baseline>
//
// followed by the unit and whether higher or lower is better. Run them with
// `make bench`. Targets are printed next to the figures and never asserted:
// a benchmark reports, it does not fail on a slow machine.
//
// BenchmarkWAN (`make bench-wan` alone) is the WAN profile: every node and
// every raw client reaches the broker through a proxy that adds 25 ms each
// way, as from a home to a central broker; the raw command baseline is the
// best of a sweep of its confirm window and prefetch (SWEEP lines), and
// the latency figures are against their floors, the round trips to the
// broker they cannot avoid.
//
// Some benchmarks take a figure apart and run only when asked, outside
// `make bench`: with MESHBOX_BENCH_SHAPE=1, RawShape (the raw command
// baseline with a command's shape added step by step: exchange kind,
// headers, user_id, a node's own broker user, commands per message) and
// RPCShape (the raw request round trip likewise: properties, headers, an
// exchange per node); with MESHBOX_BENCH_PREFETCH=1, RawPrefetch (the raw
// baseline's best prefetch). `make bench-hops` (build tag hoptrace) takes
// the request round trip apart, stretch by stretch (hops_test.go).
package bench
