// Package cluster holds the broker-cluster scenarios: meshbox nodes run as
// real child processes against a real three-node RabbitMQ cluster started
// by testing/meshtest (RabbitCluster), whose nodes are killed, stopped and
// restarted under load. It is a package of its own so that its tests run
// in parallel with the other integration packages: the cluster takes
// three brokers' start-up.
package cluster
