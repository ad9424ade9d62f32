// Package names is the one home of the rules for the names meshbox carries:
// node names, capability, stage and topic names, system message keys, and
// the names the mesh database holds (modules, setting and override keys,
// grant resources and providers, public names). Every layer - the
// appliance's config, the node's discovery messages and advertising, the
// cache's bindings, the bridge's subjects, routing keys and outbox - checks
// a name with the function of its kind here, so a name one layer accepts is
// a name every layer accepts.
//
// # What a name must be safe for
//
// A name becomes a NATS subject token (no '.', '*', '>' or whitespace inside
// a token), part of an AMQP exchange, queue or routing key (at most 255
// bytes: "to.<node>.req.<capability>" is the longest meshbox builds today),
// a RabbitMQ user name (one per node), PostgreSQL text, and later a file or
// directory name (modules). The rules below are the ones that are safe for
// all of these at once and that a user can remember: ASCII only, no
// spaces, no punctuation beyond '-', '_' and the separator of the kind.
//
// # The rules
//
//   - Node names: 1 to 64 bytes of [A-Za-z0-9_-]. No dots: a node name is
//     one NATS token and one segment of "node.<node>.requests", so it can
//     never be confused with the name that follows it.
//   - Capability and stage names, event topics and system keys: 1 to 128
//     bytes of dot-separated tokens of [A-Za-z0-9_-] ("echo",
//     "image.resize"; not ".a", "a.", "a..b", "a.*" or "café"). 128 keeps
//     every routing key and queue name built from one under AMQP's 255
//     bytes with room to spare.
//   - Module names and override keys: 1 to 128 bytes of [A-Za-z0-9_.-],
//     starting with a letter or digit (a module name is a directory name, so
//     never "-x", ".hidden" or "..").
//   - Setting keys: the same, lower case only ("broker.url").
//   - Grant resources and providers: 1 to 128 bytes of [A-Za-z0-9_.:/@-],
//     starting with a letter or digit.
//   - Public names: a DNS host name: at most 253 bytes of dot-separated
//     labels, each 1 to 63 bytes of [A-Za-z0-9-], neither starting nor
//     ending with '-'.
//
// Names are case-sensitive and compared byte for byte: "Echo" and "echo"
// are two capabilities, "Alpha" and "alpha" two nodes. Setting keys avoid
// the question by being lower case.
//
// # Errors
//
// Every check returns nil or an *Error that names the kind, the name and
// what is wrong with it (`capability name "café": byte 3 (0xc3) is not in
// [A-Za-z0-9_.-]`). Every *Error wraps ErrInvalid and one of ErrEmpty,
// ErrTooLong, ErrByte, ErrToken or ErrStart. The checks never allocate for
// a valid name, so the bridge can run them on every message.
//
// This package imports only the standard library: it is a leaf that every
// layer may use.
package names
