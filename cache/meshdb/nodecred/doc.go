// Package nodecred replaces a node's credential with a new generation and
// revokes the older ones, on the broker and in the mesh database together:
// the admin's side of the credential rotation meshdb describes, behind
// meshbox mesh node rotate and rejoin. It drives the broker through
// brokeradmin and imports nothing of the node's runtime.
//
// # Model
//
// A node's credential comes in generations. Generation k is a broker user
// (one per generation: RabbitMQ keeps one password per user, so a second
// password means a second user, see brokeradmin) and a database login
// role, both recorded in the node's own credential row in the mesh
// database. The node reads its newest generation with its bindings,
// connects with it and records in the database that it switched.
//
// Rotate gives each node generation k+1 and waits until the node recorded
// that it switched; then it revokes the older generations: their broker
// users are deleted (the broker closes their connections) and then their
// rows and login roles. The new generation's passwords are sealed to the
// node's public key, so a node that has not published one yet (it has not
// run since it joined) is not rotated. A node that does not switch in time
// keeps its older generations and its rotation stays pending: the next
// Rotate finishes the pending rotations before it starts any new one.
//
// Rejoin gives one node generation k+1 with a join token, for a machine
// that cannot take it from its bindings (it lost its configuration, or a
// forced rotation locked it out), and revokes every older generation at
// once, without waiting. The node's record, assignments, overrides and
// grants stay.
//
// # Rules
//
// A Rotator acts through Database (the mesh database, connected as the
// admin) and Broker (the broker's management API, with its admin
// credential). Connect is called at most once per Rotate or Rejoin, after
// the checks, and only when there is something to change: a call that
// fails its checks or finds nothing to rotate never touches the broker.
//
// Progress, when set, receives each step as an Event on the goroutine that
// called Rotate or Rejoin, in the order the steps happen; the call waits
// for it to return. The events are the whole report: Rotate and Rejoin
// log nothing and print nothing.
//
// A generation's broker user is made before its database row. When the
// row cannot be written, the broker user is deleted again, with a short
// timeout of its own even when ctx is done, and a failure to delete it is
// joined to the error. A revocation deletes the broker user first and the
// row last, so a revocation that fails halfway leaves the row, and the
// next Rotate finds the generation still valid and revokes it again.
//
// Only one Rotate or Rejoin may act on a node at a time, across every
// admin: two would both make generation k+1 on the broker, where the
// second replaces the first's password.
//
// Errors: the checks come first and change nothing (ErrUnknownNode,
// ErrNoCredential, an invalid node name). After them, *RevokeError means
// the new generations exist but some older ones are still valid,
// *NotSwitchedError that nodes did not switch in time (their older
// generations stay valid), *NoPublicKeyError that nodes were left out for
// lack of a public key; any other error names the step that failed.
package nodecred
