package wire

// The local programs' subjects on a node's NATS server, and the node's own
// ($MESH.*): the grammar programs speak. The broker's routing keys share
// the first words (cmd.<stage>, evt.<topic>; broker.go).
const (
	CapPrefix  = "cap."  // cap.<name>: call a capability wherever it runs
	NodePrefix = "node." // node.<node>.cap.<name>: call it on a named node
	CmdPrefix  = "cmd."  // cmd.<stage>: submit a command
	WorkPrefix = "work." // work.<stage>: a stage's local handlers
	EvtPrefix  = "evt."  // evt.<topic>: events
)

// CapSubject is the subject a program calls capability name on.
func CapSubject(name string) string { return CapPrefix + name }

// NodeCapSubject calls capability name on node.
func NodeCapSubject(node, name string) string { return NodePrefix + node + ".cap." + name }

// CommandSubject submits a command of stage.
func CommandSubject(stage string) string { return CmdPrefix + stage }

// WorkSubject is where stage's local handlers take its commands.
func WorkSubject(stage string) string { return WorkPrefix + stage }

// EventSubject carries the events of topic.
func EventSubject(topic string) string { return EvtPrefix + topic }

// EventKey routes an event of topic on the broker.
func EventKey(topic string) string { return EvtPrefix + topic }

// The node's own subjects: programs may not take them ($MESH.>).
const (
	MeshSubjects           = "$MESH.>"
	SubjectStatus          = "$MESH.status"          // the node's status (appliance.Status)
	SubjectPeers           = "$MESH.peers"           // the peers it sees
	SubjectCaps            = "$MESH.caps"            // the capabilities and stages hosted here and by peers
	SubjectModules         = "$MESH.modules"         // the modules assigned here
	SubjectModuleControl   = "$MESH.module.control"  // start, stop, restart a module
	SubjectModuleLogs      = "$MESH.module.logs"     // a module's last log lines
	SubjectModuleLogPrefix = "$MESH.module.log."     // a module's log lines as they come
	SubjectLocalConnect    = "$MESH.local.connect"   // a local program connected (the interest watcher)
	SubjectReloadPrograms  = "$MESH.programs.reload" // apply the programs' definitions now
	SubjectProgramMQTT     = "$MESH.programs.mqtt"   // a program's MQTT state: list, clear
	SubjectDeadLetters     = "$MESH.dlq"             // the dead-letter tools
	SubjectBackup          = "$MESH.backup"          // copy the node's files in use for a backup
	SubjectBlobsOpen       = "$MESH.blobs.open"      // open a blob for a program
	SubjectBlobsFetches    = "$MESH.blobs.fetches"   // a blob fetch's progress report (no reply)
	SubjectRowsPrefix      = "$MESH.rows."           // the rows API: $MESH.rows.<table>.<op>, changes on $MESH.rows.<table>.changed.<row>
)

// TableMQTTRetained is the table of rows that carries the MQTT retained
// state of the mesh: a node with an MQTT listener defines it for itself
// (unless the mesh's settings define it, with a scope say); a row is a
// topic, written from the retained publishes its devices make. Its log on
// the broker is the stream queue rows.mqtt_retained.
const TableMQTTRetained = "mqtt_retained"
