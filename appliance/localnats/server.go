package localnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// maxClosedClients bounds how many closed connections the embedded server
// remembers.
const maxClosedClients = 64

// jsMaxMemory bounds JetStream's memory store, which the node does not
// use (blobs are on disk).
const jsMaxMemory = 8 << 20

// Options configure the server. The appliance's configuration checks
// them; Start reports what fails when the server starts.
type Options struct {
	Addr string // the NATS port, host:port (port 0: a free port)
	Node string // the node's name: the server is meshbox-<node>
	// DataDir holds the administrative credential, the programs' store
	// (package programs) and JetStream's files.
	DataDir string
	// Anonymous lets clients without a credential in (AuthOpen).
	Anonymous bool
	// BlobMaxBytes turns JetStream on for the blob store, its file store
	// limited to twice this (0: off).
	BlobMaxBytes int64
	WebSocket    *WebSocketOptions // nil: no WebSocket listener
	MQTT         *MQTTOptions      // nil: no MQTT listener
	Logger       *slog.Logger      // nil: no logging
}

// Server is the node's embedded NATS server: the only door local
// programs use. It listens on the configured address (loopback by
// default). Its methods are safe for concurrent use.
type Server struct {
	srv  *server.Server
	opts *server.Options // as started, without users: the base of each reload
	auth *localAuth
	// wsURL is the WebSocket listener's URL (ws:// or wss://), "" without one.
	wsURL string
	// mqttURL is the MQTT listener's URL (mqtt:// or mqtts://), "" without
	// one; mqttPlain says it is off loopback without TLS.
	mqttURL   string
	mqttPlain bool
	// door is the MQTT listener's (mqttdoor.go), nil without one; doorNC
	// the node's connection on which it hears the retained store.
	door   *mqttDoor
	doorNC *nats.Conn
}

// Start starts the server of o and waits until it accepts clients.
func Start(o Options) (*Server, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	auth, err := newLocalAuth(o.DataDir, o.Anonymous)
	if err != nil {
		return nil, err
	}
	var more []listener
	if w := o.WebSocket; w != nil {
		auth.wsOffLoopback = w.OffLoopback
		more = append(more, &webListener{addr: w.Addr, cert: w.Cert, key: w.Key, origins: w.Origins})
	}
	if m := o.MQTT; m != nil {
		auth.mqttOffLoopback = m.OffLoopback
		more = append(more, &mqttListener{addr: m.Addr, cert: m.Cert, key: m.Key, dataDir: o.DataDir, offLoopback: m.OffLoopback})
	}
	jsDir := ""
	if o.BlobMaxBytes > 0 {
		jsDir = jetStreamDir(o.DataDir)
	}
	return startNATS(o.Addr, o.Node, jsDir, o.BlobMaxBytes, auth, logger, more...)
}

// jetStreamDir is where the server keeps JetStream's files in dataDir.
func jetStreamDir(dataDir string) string { return filepath.Join(dataDir, "jetstream") }

// startNATS starts the embedded server and waits until it accepts clients.
//
// Idle, the server wakes its process about twice a second whatever its
// options: a one-second ticker that forgets rate-limited log lines, and a
// one-second sampling of the process's CPU for its monitoring (package
// pse, running from the moment the package is linked), plus a statsz
// heartbeat of its system account every 10 s. No option turns the first
// two off, and the system account stays on: its connect events let the
// watcher of local interest sleep while no program is connected. Those
// two timers are nearly all an idle standalone node costs: each wakes the
// Go runtime's netpoller, a second thread (the scheduler's spinning M)
// and sysmon, and the sampling reads /proc/<pid>/stat; a build of the
// server without them measured 0.003–0.005 % of a core and 0.5–1.5
// wake-ups/s against 0.035–0.061 % and 17 with them. The rest of the node
// sleeps until something happens (see the README's idle figures).
//
// JetStream runs with its files in jsDir ("" turns it off), for the blob
// store alone (package blobs): its file store limited to twice
// blobs.max_bytes (blobMaxBytes), its memory store to jsMaxMemory. Who
// may use it is auth.go's matter: the node and its CLI, programs given blob rights,
// and, on an open server, anonymous clients on the existing streams only.
// JetStream without a stream costs an idle node nothing measurable; any
// stream starts the server's access-time ticker (100 ms), so the blob
// store is made only when first used (see the README for the figures).
//
// Clients authenticate as auth says (see auth.go); bad program
// definitions are logged and left out.
func startNATS(addr, node, jsDir string, blobMaxBytes int64, auth *localAuth, logger *slog.Logger, more ...listener) (_ *Server, err error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("nats address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("nats address %q: bad port", addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if err := portFree(host, port); err != nil {
		// Said at once: the server itself would only log it and leave
		// the node waiting for a server that never listens.
		return nil, err
	}
	opts := &server.Options{
		ServerName: "meshbox-" + node,
		Host:       host,
		Port:       port,
		NoSigs:     true, // the appliance owns signals
		MaxPayload: server.MAX_PAYLOAD_SIZE,
		// The server remembers closed connections for its monitoring
		// endpoint (which the appliance does not serve): 10,000 by default,
		// about 1 KB each. A client that connects per request (20 a
		// second) grew a node by ~10 MB over 8 minutes that way.
		MaxClosedClients: maxClosedClients,
		// No HTTP monitoring port: the appliance serves status itself.
	}
	if jsDir != "" {
		opts.JetStream = true
		opts.StoreDir = jsDir
		opts.JetStreamMaxStore = 2 * blobMaxBytes
		opts.JetStreamMaxMemory = jsMaxMemory
		opts.DisableJetStreamBanner = true
	}
	var web *webListener
	var mq *mqttListener
	defer func() { // the door's listener, when the server does not start
		if mq != nil && mq.ln != nil && err != nil {
			mq.ln.Close()
		}
	}()
	for _, l := range more {
		if err := l.apply(opts); err != nil {
			if m, ok := l.(*mqttListener); ok {
				mq = m
			}
			return nil, err
		}
		switch l := l.(type) {
		case *webListener:
			web = l
		case *mqttListener:
			mq = l
		}
	}
	base := opts.Clone()
	rep := auth.apply(opts)
	for _, e := range rep.Errors {
		logger.Warn("local program left out", "err", e)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	srv.SetLoggerV2(&natsLogger{l: logger}, false, false, false)
	srv.Start() // returns once the accept loop runs; the server's goroutines end in Shutdown
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("nats server: not listening on %s within 10s", addr)
	}
	n := &Server{srv: srv, opts: base, auth: auth}
	if web != nil {
		n.wsURL = web.url
	}
	if mq != nil {
		n.mqttURL, n.mqttPlain = mq.url, mq.plain()
		if err = n.openDoor(mq, logger); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// openDoor starts the MQTT door of listener mq.
func (n *Server) openDoor(mq *mqttListener, logger *slog.Logger) error {
	log := logger.With("part", "mqtt door")
	var srv *server.Server
	if inProcessMQTT() {
		srv = n.srv
	}
	n.door = newMQTTDoor(mq.ln, mq.tc, srv, mq.inner, n.auth, newMQTTBounds(mq.dataDir, log), log)
	nc, err := n.Connect("meshbox-mqtt-door")
	if err != nil {
		mq.ln.Close()
		n.door = nil
		return fmt.Errorf("mqtt door: %w", err)
	}
	n.doorNC = nc
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.door.hearRetained(ctx, nc); err != nil {
		// Charges start from nothing: a program's limit counts what its
		// devices retain from now on.
		log.Warn("MQTT door: the retained messages stored before this start are not charged to their programs", "err", err)
	}
	n.door.start()
	return nil
}

// URL is the client URL local programs use.
func (n *Server) URL() string { return n.srv.ClientURL() }

// NATS is the nats-server itself, for what reads its state (the
// watcher of local interest, the tables' interest in a subject).
func (n *Server) NATS() *server.Server { return n.srv }

// Running reports whether the server runs.
func (n *Server) Running() bool { return n.srv.Running() }

// Connect opens an in-process client connection (no TCP) named name, with
// the node's administrative credential.
func (n *Server) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		n.auth.connOption(),
		nats.InProcessServer(n.srv),
		nats.MaxReconnects(-1),
	}, extra...)
	return nats.Connect("", opts...)
}

// connectResponder opens the node's responder connection (in process):
// it may publish on _INBOX.> and nothing else, so an answer the node gives
// a local client can never land on the node's own subjects, the JetStream
// API or a mesh subject, whatever reply subject the client gave. A
// publish the server refuses is logged here (the checks before it should
// have refused it: rights.go).
func (n *Server) connectResponder(name string, logger *slog.Logger) (*nats.Conn, error) {
	return nats.Connect("",
		nats.Name(name),
		n.auth.responderOption(),
		nats.InProcessServer(n.srv),
		nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			logger.Warn("the responder connection was refused a publish", "err", err)
		}),
	)
}

// Close shuts the server down and waits until it has. It is idempotent.
func (n *Server) Close() {
	if n == nil || n.srv == nil {
		return
	}
	if n.door != nil {
		n.door.close()
	}
	if n.doorNC != nil {
		n.doorNC.Close()
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

// natsLogger adapts the server's logger to slog. Notices are logged at
// debug level: the appliance itself says what matters about the server.
type natsLogger struct{ l *slog.Logger }

func (n *natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.HasPrefix(msg, "Websocket not configured with TLS") {
		// Only ever on loopback (the appliance's configuration checks
		// that): nothing crosses a network.
		n.l.Debug(msg)
		return
	}
	n.l.Warn(msg)
}
func (n *natsLogger) Fatalf(format string, v ...any) { n.l.Error(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Errorf(format string, v ...any) { n.l.Error(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Debugf(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n *natsLogger) Tracef(format string, v ...any) {}

// portFree checks that host:port can be listened on now, and says who to
// ask when not: another meshbox, or another NATS server, is the usual
// holder.
func portFree(host string, port int, setting ...string) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	what, set := "nats address", "--nats or MESHBOX_NATS"
	if len(setting) > 0 {
		what, set = setting[0]+" address", setting[0]
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%s %s is in use by another program (another meshbox or NATS server? ss -ltnp 'sport = :%d' names it); set another with %s", what, addr, port, set)
		}
		return fmt.Errorf("%s %s: %w", what, addr, err)
	}
	return l.Close()
}
