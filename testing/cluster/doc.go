// Package cluster holds the broker-cluster fault scenario: meshbox nodes
// run as real child processes against a real three-node RabbitMQ cluster
// started by testing/meshtest (RabbitCluster), whose nodes are killed,
// stopped and restarted under load (Faults). Its test runs the scenario
// at the size make test affords; testing/soak runs it with 10,000
// commands and 10,000 events (make soak). It is a package of its own so
// that its test runs in parallel with the other integration packages.
//
// A meshbox node picks one broker of its list at random; the scenario
// places each node on the broker node it wants by giving every node a
// proxy per broker node (placed, startPlaced) and refusing connections on
// all but one until the node is connected. A ledger (testing/ledger)
// keeps what submitters were told and what handlers and subscribers saw.
package cluster
