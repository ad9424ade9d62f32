// Package e2e holds end-to-end scenarios: meshbox nodes run as real child
// processes against the real RabbitMQ and PostgreSQL started by
// testing/meshtest, driven by ordinary NATS clients and the meshbox CLI.
package e2e
