// Package meshtest is the integration-test harness of meshbox.
//
// It starts the real services the tests talk to: a RabbitMQ broker and a
// PostgreSQL server, each in its own temporary directory, on its own free
// loopback ports, and it builds and runs the meshbox binary as a child
// process. Nothing depends on a system-wide broker or database; the
// packages are installed by testing/services.sh.
//
// Each integration-test package wires the harness into its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(meshtest.Main(m)) }
//
// Shared services ([RabbitMQ], [Postgres]) start on first use and are
// stopped by [Main] after the tests ran. Private services ([NewRabbitMQ],
// [NewPostgres]) are for fault tests that stop, kill and restart them; they
// are stopped in the test's Cleanup. Tests isolate themselves inside a
// shared service with [Rabbit.Vhost] and [PG.Database], which create a vhost
// or database named after the test and remove it in Cleanup. Broker users
// are a broker's, not a vhost's: a test whose nodes get users of their own
// (mesh node add, join, rotate) takes a broker of a small pool with
// [LeaseRabbitMQ], its own until its Cleanup, so that tests in parallel
// can each have a node alpha.
//
// The tests of a package run in parallel where they call t.Parallel; [Main]
// lets eight run at once unless -test.parallel says otherwise, since they
// mostly wait on services and child processes.
//
// Tests wait on states through one poller: [WaitFor] and [Eventually] fail
// the test when a condition does not hold in time, [Poll] reports it.
// [Status] reads a node's GET /status as the node's own type,
// appliance.Status, and [WaitStatus] waits until it says what the test
// wants. A test's own AMQP client (an operator, an adversary, a tap) comes
// from [Dial] or [Channel].
//
// [NewRabbitCluster] starts a three-node RabbitMQ cluster for a test: three
// brokers with their own node names, ports and directories, one Erlang
// cookie, joined with rabbitmqctl join_cluster. Each node can be stopped,
// killed (SIGKILL) and started again on its own, and the management API
// tells which node leads a quorum queue ([RabbitCluster.Leader]).
//
// Every child process is started in its own process group and, on Linux,
// with a parent-death signal, so a test binary that dies (a panic, a
// timeout) does not leave brokers or databases running. Directories left
// behind by such a binary are removed by the next [Main] of any package.
//
// The broker and database servers are found in the usual places of the
// distribution packages (the newest PostgreSQL version wins); the variables
// MESHTEST_RABBITMQ_SERVER (the rabbitmq-server start script) and
// MESHTEST_PG_BIN (the directory of initdb and postgres) override that.
// MESHTEST_MESHBOX names a meshbox executable for [Binary] to return
// instead of building one (make test sets it to the binary of make build).
// When the tests run as root, the servers run as the rabbitmq and postgres
// system users.
//
// An embedded NATS server for a test, and connections to it, come from
// the leaf package [github.com/meshbox/meshbox/testing/meshtest/natstest],
// which package-internal tests of node and bridge can import too.
//
// Helpers take a testing.TB and fail the test (Fatal) when a service cannot
// be started or controlled; they must be called from the test goroutine.
package meshtest
