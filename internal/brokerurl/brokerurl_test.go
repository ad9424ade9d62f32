package brokerurl

import (
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want []string
	}{
		{"", nil},
		{"  ", nil},
		{"amqp://a", []string{"amqp://a"}},
		{"amqp://a, amqp://b:5673/v ,amqps://c", []string{"amqp://a", "amqp://b:5673/v", "amqps://c"}},
		{"amqp://a,,amqp://b", []string{"amqp://a", "", "amqp://b"}},
		{"amqp://a,", []string{"amqp://a", ""}},
	} {
		if got := Split(tc.raw); !slices.Equal(got, tc.want) {
			t.Errorf("Split(%q): got %q, want %q", tc.raw, got, tc.want)
		}
	}
}

func TestMapJoin(t *testing.T) {
	got := Map("amqp://a, amqp://b", func(u string) string { return u + "/x" })
	if want := "amqp://a/x,amqp://b/x"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestHost(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://u:secret@rmq-a:5673/v": "rmq-a:5673",
		"amqp://rmq-b/v":               "rmq-b:5672",
		"amqps://rmq-c":                "rmq-c:5671",
		"amqp://[::1]/":                "[::1]:5672",
		"not a url":                    "",
		"amqp://%zz":                   "",
	} {
		if got := Host(raw); got != want {
			t.Errorf("Host(%q): got %q, want %q", raw, got, want)
		}
	}
}
