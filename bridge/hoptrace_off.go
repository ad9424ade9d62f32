//go:build !hoptrace

package bridge

// hop does nothing without the hoptrace build tag (hoptrace.go): the
// points of a request's round trip cost nothing in a normal build.
func hop(Hop) {}
