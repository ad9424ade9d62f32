// Package soak runs two meshbox nodes under mixed load for a long time and
// says whether their memory grows: `make soak` (build tag soak; `make test`
// does not run it).
//
// Node A submits commands that node B handles, publishes an event every
// few milliseconds, calls a capability B hosts over one persistent
// connection, and serves callers that open a new connection per request
// (connection churn); B is churned the same way. Every SOAK_SAMPLE the
// resident and anonymous memory of each node process is read from /proc;
// after SOAK_WARMUP the slope of the anonymous memory (least squares, MB
// per minute) must stay under SOAK_MAX_SLOPE on both nodes.
//
// Settings (environment): SOAK_DURATION (30m), SOAK_WARMUP (a sixth of the
// duration, at least 1m), SOAK_SAMPLE (10s), SOAK_MAX_SLOPE (0.1 MB/min),
// SOAK_COMMAND_RATE (200 per second), SOAK_CHURN_RATE (20 connections per
// second per node).
//
// TestSoakClusterFaults runs the broker-cluster fault scenario of package
// testing/cluster at full size: 10,000 commands and 10,000 events.
package soak
