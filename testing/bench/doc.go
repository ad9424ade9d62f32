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
package bench
