// Command testmodule is a small meshbox module for the end-to-end tests: it
// connects to the node's NATS server as any module does (NATS_URL, and its
// own credential NATS_NKEY with the inbox prefix NATS_INBOX_PREFIX when
// set), hosts the capability named by CAP, and answers a
// call with "hello from MODULE on NODE", or with the value of an
// environment variable when the request is "env:NAME". It stops on
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
