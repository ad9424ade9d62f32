package doctor

import (
	"context"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
)

// checkNATSBind: the local NATS server is for programs on this machine; it
// must listen on loopback only. Checks the configured address, the address
// the running node reports, and whether the port answers on this machine's
// other addresses.
func (d *Doctor) checkNATSBind(ctx context.Context) Check {
	const name = "local NATS"
	hint := "listen on loopback only: --nats 127.0.0.1:4222 (MESHBOX_NATS)"
	// What the running node uses, when it answers; the configuration's
	// address otherwise.
	addrs := []string{d.cfg.NATS}
	note := ""
	if d.status != nil {
		if pu, err := url.Parse(d.status.NATS.URL); err == nil && pu.Host != "" {
			if ConnectAddr(d.cfg.NATS) != ConnectAddr(pu.Host) {
				note = "; the configuration read here says " + d.cfg.NATS + " (is --env-file the node's?)"
			}
			addrs = []string{pu.Host}
		}
	}
	for _, a := range addrs {
		if !appliance.LoopbackAddr(a) {
			return fail(name, hint, "NATS listens on %s, which other machines can reach", a)
		}
	}
	port := ""
	for _, a := range addrs {
		if _, p, err := net.SplitHostPort(a); err == nil && p != "0" {
			port = p
		}
	}
	if port != "" {
		if open := answersOffLoopback(ctx, port, 300*time.Millisecond); len(open) > 0 {
			return fail(name, hint, "port %s answers on %s, not only on loopback", port, strings.Join(open, ", "))
		}
	}
	return ok(name, "listens on loopback only (%s)%s", strings.Join(dedupe(addrs), ", "), note)
}

// answersOffLoopback dials port on every non-loopback address of this
// machine and returns those that accept a connection.
func answersOffLoopback(ctx context.Context, port string, timeout time.Duration) []string {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var open []string
	dialer := net.Dialer{Timeout: timeout}
	for _, a := range ifaddrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		target := net.JoinHostPort(ipn.IP.String(), port)
		c, err := dialer.DialContext(ctx, "tcp", target)
		if err == nil {
			_ = c.Close()
			open = append(open, ipn.IP.String())
		}
	}
	return open
}

// ConnectAddr turns a listen address into one to connect to: an
// unspecified host (0.0.0.0, ::, "") becomes 127.0.0.1.
func ConnectAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
