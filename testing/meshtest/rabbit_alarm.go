package meshtest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rabbitWatermark is the memory high watermark the harness configures
// (rabbitmq.conf: vm_memory_high_watermark.relative).
const rabbitWatermark = "0.6"

// RaiseMemoryAlarm sets the broker's memory high watermark so low that
// RabbitMQ raises a memory alarm at once: it blocks every connection that
// publishes, as a real memory shortage does. Use it on a private broker
// (NewRabbitMQ): the alarm holds for every vhost. It is cleared in tb's
// Cleanup, or earlier with ClearMemoryAlarm.
func (r *Rabbit) RaiseMemoryAlarm(tb testing.TB) {
	tb.Helper()
	if err := r.ctl("set_vm_memory_high_watermark", "0.0000001"); err != nil {
		tb.Fatalf("meshtest: raise memory alarm: %v", err)
	}
	tb.Cleanup(func() {
		if r.running() {
			if err := r.ctl("set_vm_memory_high_watermark", rabbitWatermark); err != nil {
				tb.Errorf("meshtest: clear memory alarm: %v", err)
			}
		}
	})
}

// ClearMemoryAlarm restores the harness's memory high watermark: the alarm
// clears and blocked publishers go on.
func (r *Rabbit) ClearMemoryAlarm(tb testing.TB) {
	tb.Helper()
	if err := r.ctl("set_vm_memory_high_watermark", rabbitWatermark); err != nil {
		tb.Fatalf("meshtest: clear memory alarm: %v", err)
	}
}

// ctl runs rabbitmqctl against this broker, as the broker's account and
// with its home (where the Erlang cookie is).
func (r *Rabbit) ctl(args ...string) error {
	_, err := r.ctlOutput(args...)
	return err
}

// ctlOutput is ctl returning what rabbitmqctl printed.
func (r *Rabbit) ctlOutput(args ...string) (string, error) {
	script, err := rabbitScript()
	if err != nil {
		return "", err
	}
	ctl := filepath.Join(filepath.Dir(script), "rabbitmqctl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctl, append([]string{"-n", r.node}, args...)...)
	cmd.Dir = r.dir
	cmd.Env = cleanEnv([]string{"RABBITMQ_", "HOME=", "ERL_"}, "HOME="+r.dir)
	cmd.SysProcAttr = childAttr(r.acc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Ctl runs rabbitmqctl against this broker (as an operator would with
// sudo rabbitmqctl) and returns what it printed.
func (r *Rabbit) Ctl(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := r.ctlOutput(args...)
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	return out
}

// CtlOutput runs rabbitmqctl against this broker and returns what it
// printed and its error (for cleanups that must not fail a test).
func (r *Rabbit) CtlOutput(args ...string) (string, error) { return r.ctlOutput(args...) }

// CloseUserConnections closes every connection of the broker user user,
// as an operator does with rabbitmqctl close_all_user_connections. The
// command fails (exit 69, "{:normal, {:gen_server, :call, ...") when a
// connection ends on its own while the broker closes it, which is what
// was asked: it runs again then, up to three times in all.
func (r *Rabbit) CloseUserConnections(tb testing.TB, user, reason string) {
	tb.Helper()
	var err error
	for range 3 {
		if _, err = r.ctlOutput("close_all_user_connections", user, reason); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "{:normal, {:gen_server, :call") {
			break
		}
		tb.Logf("meshtest: a connection of %s ended while the broker closed it; closing the rest again: %v", user, err)
	}
	tb.Fatalf("meshtest: %v", err)
}
