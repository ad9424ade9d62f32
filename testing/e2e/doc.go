// Package e2e holds end-to-end scenarios: meshbox nodes run as real child
// processes against the real RabbitMQ and PostgreSQL started by
// testing/meshtest, driven by ordinary NATS clients and the meshbox CLI.
//
// Every scenario runs in parallel with the others (t.Parallel) except
// those that time what they check against a bound of a second or two
// (discovery, deadlines, "at once", a CLI's round trip) and would fail on
// a busy machine instead of on a slow node: they run first, one at a
// time. A scenario whose nodes get broker users of their own runs on a
// leased broker (meshtest.LeaseRabbitMQ); one that stops the broker or
// the database, on a private one.
package e2e
