// Package localnats is the node's embedded NATS server: the one door local
// programs use, with its authentication and the checks of what a local
// client may make the node do.
//
// Start runs a Server from Options: the NATS port (loopback by default),
// and beside it an optional WebSocket listener (pages with nats.ws) and an
// optional MQTT listener (devices signing in as programs with an MQTT
// password). Who may connect (auth.go): the node's own connections and its
// CLI with the administrative nkey in the data directory, each local
// program with its own nkey and rights (package programs), and clients
// without a credential only when Options.Anonymous says so. Reload applies
// the programs' store to the running server without a restart.
//
// Rights answers the node's parts (the bridge, the blob server, the
// tables) when a local client's message would make the node act: a reply
// subject, a result topic, a call (rights.go). A Responder answers local
// clients on a connection that may publish on _INBOX.> and nothing else.
// ServeMicro makes NATS micro discovery (nats micro ls) see the whole mesh.
//
// The MQTT listener is the node's own door (mqttdoor.go), not the
// server's: it takes each device's CONNECT (password, client ID owned by
// one program, the program's sessions) and checks every packet the
// device sends against its program's limits (mqttbounds.go), because the
// server keys sessions by client ID alone and bounds its MQTT streams
// per account, not per user. The server takes the device's connection in
// this process through its unexported MQTT constructor, reached with
// go:linkname and used only with the server version it was checked
// against (mqttpass.go); with another version the door passes devices
// over loopback TCP, at about twice the round. A failed accept on the
// door's listener (out of file descriptors, say) is counted by cause and
// logged at most once a minute per cause (mqttaccept.go); the door goes
// on accepting. MQTT over WebSocket is off: the server's WebSocket
// listener would take MQTT past the door.
//
// Caveats: the server runs JetStream only for the blob store and for MQTT,
// in <data dir>/jetstream; Options are checked by the appliance's
// configuration, so Start reports only what fails when it runs. A Server
// is closed once, with Close, after every connection the node opened on it.
package localnats
