package link

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
)

func TestUnreachable(t *testing.T) {
	dial := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", dial(syscall.ECONNREFUSED), true},
		{"no route", dial(syscall.EHOSTUNREACH), true},
		{"dial timeout", dial(context.DeadlineExceeded), true},
		{"resolver down", dial(&net.DNSError{Err: "i/o timeout", Name: "rmq.example.org", IsTimeout: true}), true},
		{"no such host", dial(&net.DNSError{Err: "no such host", Name: "rmq.example.org", IsNotFound: true}), false},
		{"no such host, wrapped", fmt.Errorf("connect to broker: %w", dial(&net.DNSError{IsNotFound: true})), false},
	} {
		if got := Unreachable(tc.err); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
