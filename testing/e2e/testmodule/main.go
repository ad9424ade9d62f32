// Command testmodule is a small meshbox module for the end-to-end tests: it
// connects to the node's NATS server as any module does (NATS_URL, and its
// own credential NATS_NKEY with the inbox prefix NATS_INBOX_PREFIX when
// set), hosts the capability named by CAP, and answers a
// call with "hello from MODULE on NODE", with the value of an
// environment variable when the request is "env:NAME", and, when it is
// "sub:SUBJECT" or "pub:SUBJECT", with "allowed" or "denied: ..." as its
// credential lets a new connection subscribe or publish there. It stops on
// SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
)

func main() {
	opts := []nats.Option{nats.Name("testmodule " + os.Getenv("MESHBOX_MODULE"))}
	if seed := os.Getenv("NATS_NKEY"); seed != "" {
		opt, err := nats.NkeyOptionFromSeed(seed)
		if err != nil {
			fmt.Fprintln(os.Stderr, "credential:", err)
			os.Exit(1)
		}
		opts = append(opts, opt, nats.CustomInboxPrefix(os.Getenv("NATS_INBOX_PREFIX")))
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	capName := os.Getenv("CAP")
	if _, err := nc.QueueSubscribe("cap."+capName, "testmodule", func(m *nats.Msg) {
		body := string(m.Data)
		if name, ok := strings.CutPrefix(body, "env:"); ok {
			_ = m.Respond([]byte(os.Getenv(name)))
			return
		}
		if op, subject, ok := strings.Cut(body, ":"); ok && (op == "sub" || op == "pub") {
			_ = m.Respond([]byte(probe(opts, op, subject)))
			return
		}
		_ = m.Respond([]byte(fmt.Sprintf("hello from %s on %s", os.Getenv("MESHBOX_MODULE"), os.Getenv("MESHBOX_NODE"))))
	}); err != nil {
		fmt.Fprintln(os.Stderr, "subscribe:", err)
		os.Exit(1)
	}
	if err := nc.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "flush:", err)
		os.Exit(1)
	}
	fmt.Println("up, hosting cap." + capName)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	fmt.Println("stopping")
	nc.Close()
}

// probe says whether a new connection with opts may subscribe (op "sub")
// or publish ("pub") on subject: the server answers a denied one with a
// permissions violation before the pong that ends the flush.
func probe(opts []nats.Option, op, subject string) string {
	nc, err := nats.Connect(os.Getenv("NATS_URL"), opts...)
	if err != nil {
		return "connect: " + err.Error()
	}
	defer nc.Close()
	if op == "sub" {
		_, err = nc.SubscribeSync(subject)
	} else {
		err = nc.Publish(subject, []byte("probe"))
	}
	if err == nil {
		err = nc.Flush()
	}
	if err == nil {
		err = nc.LastError()
	}
	if err != nil {
		return "denied: " + err.Error()
	}
	return "allowed"
}
