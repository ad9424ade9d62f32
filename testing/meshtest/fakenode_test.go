package meshtest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// fakeNode stands in for `meshbox run` when the test binary is started with
// MESHTEST_FAKE_NODE set: it logs its arguments and a ready line in the
// format mode names ("text", "json"), then serves until SIGTERM (exit 0).
// Mode "refuse" exits at once with code 3; "silent" never becomes ready.
func fakeNode(mode string, args []string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	fmt.Fprintf(os.Stdout, "fake node args: %s\n", strings.Join(args, " "))
	switch mode {
	case "text":
		fmt.Fprintf(os.Stderr, "time=2026-01-02T03:04:05Z level=INFO msg=starting component=appliance\n")
		// The ready line arrives in two writes, as a pipe may deliver it.
		fmt.Fprintf(os.Stderr, `time=2026-01-02T03:04:05Z level=INFO msg="node ready" node=fake nats=nats://127.0.0.1:4222`)
		time.Sleep(50 * time.Millisecond)
		fmt.Fprintf(os.Stderr, " http=http://127.0.0.1:7222 data=\"/tmp/a b\"\n")
	case "json":
		line, _ := json.Marshal(map[string]string{"time": "2026-01-02T03:04:05Z", "level": "INFO", "msg": "node ready", "node": "fake", "nats": "nats://127.0.0.1:4223", "http": "http://127.0.0.1:7223"})
		fmt.Fprintf(os.Stderr, "%s\n", line)
	case "refuse":
		fmt.Fprintf(os.Stderr, "time=2026-01-02T03:04:05Z level=ERROR msg=\"data directory is in use by another meshbox process\"\n")
		return 3
	case "silent":
	default:
		fmt.Fprintf(os.Stderr, "unknown fake mode %q\n", mode)
		return 2
	}
	<-sigs
	fmt.Fprintf(os.Stderr, "time=2026-01-02T03:04:06Z level=INFO msg=stopped\n")
	return 0
}
