// Package doctor checks the situation of a meshbox node — its data
// directory, the running node, the bindings cache, the mesh database, the
// broker, clocks, names and the local NATS listener — and says what is
// wrong and what to do about it. It is `meshbox doctor`.
//
// Each group of checks has its own file: variables.go (MESHBOX_*
// variables meshbox does not know), files.go (data directory and files),
// node.go (the running node and the bindings cache), database.go (the
// mesh database and the clock), broker.go, credential.go (the broker
// user), names.go (multicast names, the hosts file) and nats.go (the
// local NATS listener).
//
// The package lives under cmd/meshbox because it is a part of the command
// line, not of the running node: like cmd/meshbox it imports appliance (for
// the configuration and the typed status), and the rule that nothing below
// cmd and testing/ imports appliance stays as it is. The command builds the
// configuration with appliance.LoadConfig, the one loader `meshbox run`
// uses, and hands it over with a way to ask the running node for its
// status.
package doctor
