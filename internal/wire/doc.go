// Package wire is meshbox's protocol as names and rules: everything local
// programs, peer nodes and the broker see of a node, with no runtime
// behind it.
//
// The protocol has four faces, each in its own file (the broker's in two):
//   - subjects.go: the subjects local programs use on the node's NATS
//     server (cap., node.<n>.cap., cmd., work., evt.) and the node's own
//     $MESH.* subjects;
//   - headers.go: the Meshbox-* headers programs and peers read, and the
//     broker link's states as a status shows them;
//   - errors.go: error replies (the NATS micro headers, the codes, the
//     one ServiceError) and the rules for reading them;
//   - broker.go and queues.go: exchanges, queues, routing keys, the broker
//     users of nodes and their permissions, and the durable queues the
//     admin declares;
//
// and message.go holds what a message's ids and headers may be, which the
// bridge checks on the way in and the outbox on the way back from disk.
//
// The rules:
//   - Every package that speaks the protocol takes its words from here;
//     no other file spells a subject, a header or a code (a test reads
//     every file of the module for them). Drift becomes a compile error.
//   - wire imports only the standard library and internal/names: the
//     admin tools (brokeradmin, nodecred), the command line and the
//     doctor use it without the runtime.
//   - The manual's tables of subjects and error codes (docs/programs.md)
//     are checked against it.
package wire
